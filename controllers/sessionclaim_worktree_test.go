package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/worktree"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// sandboxRun runs argv in the Sandbox's instance through the runtime.
func sandboxRun(agent string, argv ...string) (int, string, string) {
	GinkgoHelper()
	var out, errb bytes.Buffer
	st, err := mgr.rt.Exec(ctx, v1alpha1.InstanceName(agent), runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
	Expect(err).NotTo(HaveOccurred())
	return st.Code, out.String(), errb.String()
}

// newRepo makes a repository with one commit on main at dir.
func newRepo(dir string) {
	GinkgoHelper()
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	testharness.HostGit(dir, "init", "-q", "-b", "main")
	Expect(os.WriteFile(filepath.Join(dir, "README"), []byte("hello\n"), 0o644)).To(Succeed())
	testharness.HostGit(dir, "add", "README")
	testharness.HostGit(dir, "commit", "-q", "-m", "first")
}

func giveToAgent(dir, agent string) { GinkgoHelper(); testharness.GiveToAgent(env, dir, agent) }

func claimWithWorktree(ns, name, sandbox, repo string) *v1alpha1.SessionClaim {
	c := newClaim(ns, name, sandbox)
	c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: repo, CreateBranch: true}
	return c
}

// The worktree specs every backend runs: add, use and commit inside, gc,
// clean removed and dirty kept.
var _ = testharness.DescribeWorktrees("bwrap", testharness.WorktreeSuite{
	Env: func() *testharness.Env { return env },
	NewSandbox: func(ns, name, agent string) *v1alpha1.Sandbox {
		return newSandbox(ns, name, agent, time.Minute)
	},
	Runtime: func() runtimes.Runtime { return mgr.rt },
})

// What the controller reports of a worktree that goes wrong, and
// worktrees with relative links, on the default backend.
var _ = Describe("Session worktree health", Ordered, func() {
	var ns, mountDir, repo string
	const agent = "gitty"

	BeforeAll(func() {
		testenv.Binary(GinkgoT(), "git", "install git (hack/install-deps.sh)")
		ns = newNamespace()
		mountDir = filepath.Join(env.Dir, "projects")
		repo = filepath.Join(mountDir, "app")
		newRepo(repo)

		sb := newSandbox(ns, "gitty", agent, time.Minute)
		sb.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		giveToAgent(mountDir, agent)
		Expect(k8s.Create(ctx, claimWithWorktree(ns, "s1", "gitty", "project/app"))).To(Succeed())
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))
	})

	It("reports a locked worktree as WorktreeLocked on the claim and the Sandbox", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		// A claim with a worktree is released before it goes, and goes with its Sandbox.
		Expect(c.Finalizers).To(ContainElement(v1alpha1.Finalizer))
		Expect(c.OwnerReferences).To(ContainElement(HaveField("Name", "gitty")))
		testharness.HostGit(repo, "worktree", "lock", "--reason", "moved to a laptop", c.Status.Worktree.HostPath)
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionFalse, v1alpha1.ReasonWorktreeLocked)))
		Eventually(sandboxStatus(ns, "gitty"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionFalse, v1alpha1.ReasonWorktreeLocked)))
		testharness.HostGit(repo, "worktree", "unlock", c.Status.Worktree.HostPath)
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))
	})

	It("reads and writes the worktree's files as the agent: a file only root may read is not shown, the exclude file written is the agent's", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		agentDir, err := os.Stat(filepath.Join(env.AreasRoot, agent))
		Expect(err).NotTo(HaveOccurred())
		uid := agentDir.Sys().(*syscall.Stat_t).Uid
		exclude, err := os.Stat(filepath.Join(repo, ".git", "info", "exclude"))
		Expect(err).NotTo(HaveOccurred())
		Expect(exclude.Sys().(*syscall.Stat_t).Uid).To(Equal(uid), "the exclude file the controller wrote belongs to uid %d", exclude.Sys().(*syscall.Stat_t).Uid)

		// A locked file the agent cannot read: another user's, as a
		// shared mount holds them, or one a link swapped in.
		admin := filepath.Join(repo, ".git", "worktrees", filepath.Base(c.Status.Worktree.HostPath))
		locked := filepath.Join(admin, "locked")
		Expect(os.WriteFile(locked, []byte("TOPSECRET-of-root\n"), 0o600)).To(Succeed())
		Expect(os.Chown(locked, 0, 0)).To(Succeed())
		Eventually(func(g Gomega) {
			var got v1alpha1.SessionClaim
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &got)).To(Succeed())
			cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionGitHealthy)
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(cond.Message).To(ContainSubstring("permission denied"))
			for _, cond := range got.Status.Conditions {
				g.Expect(cond.Message).NotTo(ContainSubstring("TOPSECRET"), cond.Type)
			}
		}, timeout).Should(Succeed())
		Expect(os.Remove(locked)).To(Succeed())
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))
	})

	It("reports ProbeFailed with the reason when git cannot run inside the sandbox though the host sees a healthy worktree", func() {
		setBinaries := func(bins ...v1alpha1.BinaryName) {
			// The controller writes the object too: retry on conflicts.
			Eventually(func() error {
				var sb v1alpha1.Sandbox
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gitty"}, &sb); err != nil {
					return err
				}
				sb.Spec.Binaries = bins
				return k8s.Update(ctx, &sb)
			}, timeout).Should(Succeed())
		}
		setBinaries("sh")
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionFalse, v1alpha1.ReasonProbeFailed)))
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		Expect(meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionGitHealthy).Message).To(
			And(ContainSubstring("git rev-parse inside the sandbox failed"), ContainSubstring("allowlist")))
		setBinaries("git", "sh")
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))
	})

	It("checks a worktree out once: a status that says it is not (as a cache behind the checkout's write does) does not reset the agent's work", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		wt := c.Status.Worktree.Path
		code, _, stderr := sandboxRun(agent, "sh", "-c", "cd "+wt+" && echo draft > draft.txt && git add -N draft.txt && echo edited >> README")
		Expect(code).To(Equal(0), stderr)

		Eventually(func() error {
			var c v1alpha1.SessionClaim
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c); err != nil {
				return err
			}
			c.Status.Worktree.CheckedOut = false
			return k8s.Status().Update(ctx, &c)
		}, timeout).Should(Succeed())
		Eventually(claimStatus(ns, "s1"), timeout).Should(HaveField("Worktree.CheckedOut", BeTrue()))
		code, out, stderr := sandboxRun(agent, "git", "-C", wt, "status", "--porcelain")
		Expect(code).To(Equal(0), stderr)
		Expect(out).To(And(ContainSubstring("draft.txt"), ContainSubstring("README")),
			"the pass that read the old status must not check the worktree out again over the agent's work")

		code, _, stderr = sandboxRun(agent, "sh", "-c", "cd "+wt+" && git reset -q --hard && git clean -fq")
		Expect(code).To(Equal(0), stderr)
	})

	It("does not check out again a worktree a second claim names: the first claim's uncommitted work stays", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		wt := c.Status.Worktree.Path
		code, _, stderr := sandboxRun(agent, "sh", "-c", "cd "+wt+" && echo unsaved >> README")
		Expect(code).To(Equal(0), stderr)

		again := newClaim(ns, "s1-again", "gitty")
		again.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app", Name: "s1"}
		Expect(k8s.Create(ctx, again)).To(Succeed())
		Eventually(claimStatus(ns, "s1-again"), timeout).Should(And(
			HaveField("Worktree.Path", wt),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated))))
		Expect(os.ReadFile(filepath.Join(c.Status.Worktree.HostPath, "README"))).To(Equal([]byte("hello\nunsaved\n")),
			"a worktree with files in it was checked out already; checking it out again resets that work")

		deleteAndWait(again)
		Expect(os.ReadFile(filepath.Join(c.Status.Worktree.HostPath, "README"))).To(Equal([]byte("hello\nunsaved\n")), "dirty: kept")
		code, _, stderr = sandboxRun(agent, "git", "-C", wt, "checkout", "--", "README")
		Expect(code).To(Equal(0), stderr)
	})

	It("keeps a shared worktree while another live claim records it, and removes it with the last claim", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		again := newClaim(ns, "s1-again", "gitty")
		again.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app", Name: "s1"}
		Expect(k8s.Create(ctx, again)).To(Succeed())
		Eventually(claimStatus(ns, "s1-again"), timeout).Should(And(
			HaveField("Worktree.HostPath", c.Status.Worktree.HostPath),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated))))
		code, out, stderr := sandboxRun(agent, "git", "-C", c.Status.Worktree.Path, "status", "--porcelain")
		Expect(code).To(Equal(0), stderr)
		Expect(out).To(BeEmpty(), "clean: only another claim's use keeps it")

		deleteAndWait(again)
		Expect(filepath.Join(c.Status.Worktree.HostPath, "README")).To(BeARegularFile(), "s1 still uses its worktree")
		Consistently(claimStatus(ns, "s1"), 2*time.Second).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))

		// Two claims of one worktree deleted at once: neither is live when
		// the other goes, so the worktree goes with them.
		first := claimWithWorktree(ns, "pair", "gitty", "project/app")
		Expect(k8s.Create(ctx, first)).To(Succeed())
		Eventually(claimStatus(ns, "pair"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)))
		second := newClaim(ns, "pair-again", "gitty")
		second.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app", Name: "pair"}
		Expect(k8s.Create(ctx, second)).To(Succeed())
		Eventually(claimStatus(ns, "pair-again"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(first), first)).To(Succeed())
		shared := first.Status.Worktree.HostPath
		Expect(k8s.Delete(ctx, first)).To(Succeed())
		Expect(k8s.Delete(ctx, second)).To(Succeed())
		for _, gone := range []client.Object{first, second} {
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(gone), gone))
			}, timeout).Should(BeTrue(), "%s should be gone", gone.GetName())
		}
		Expect(shared).NotTo(BeADirectory(), "the last claim of a clean worktree removes it")
	})

	It("keeps a clean worktree whose detached HEAD holds commits no branch has when its claim goes", func() {
		c := newClaim(ns, "detached", "gitty")
		c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app"}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Eventually(claimStatus(ns, "detached"), timeout).Should(And(
			HaveField("Worktree.Branch", ""),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated))))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(c), c)).To(Succeed())
		wt := c.Status.Worktree.Path
		code, _, stderr := sandboxRun(agent, "sh", "-c", "cd "+wt+" && echo work >> README && git add README && "+
			"git -c user.name=agent -c user.email=agent@example.com commit -q -m 'on a detached HEAD'")
		Expect(code).To(Equal(0), stderr)
		code, commit, stderr := sandboxRun(agent, "git", "-C", wt, "rev-parse", "HEAD")
		Expect(code).To(Equal(0), stderr)

		deleteAndWait(c)
		Expect(testharness.HostGit(repo, "rev-list", "--all")).To(ContainSubstring(strings.TrimSpace(commit)),
			"the commit made on the detached HEAD is still reachable")
		Expect(c.Status.Worktree.HostPath).To(BeADirectory(), "kept")
		testharness.HostGit(repo, "worktree", "remove", "--force", c.Status.Worktree.HostPath)
	})

	It("takes a worktree with relative links as it is: no git directory at its host path, git works through the mount", func() {
		var s1 v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &s1)).To(Succeed())
		deleteAndWait(&s1)
		// The git directory stays bound while the instance runs: stop it
		// (idle at once), and it starts again below with what the
		// relative worktree needs, nothing.
		Consistently(sandboxStatus(ns, "gitty"), time.Second).Should(HaveField("MountedGitDirs", ConsistOf(filepath.Join(repo, ".git"))),
			"bound until the instance stops")
		Eventually(func() error {
			var sb v1alpha1.Sandbox
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gitty"}, &sb); err != nil {
				return err
			}
			sb.Spec.IdleTimeout = &metav1.Duration{Duration: time.Second}
			return k8s.Update(ctx, &sb)
		}, timeout).Should(Succeed())
		Eventually(sandboxStatus(ns, "gitty"), timeout).Should(And(
			HaveField("MountedGitDirs", BeEmpty()),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonStopped))))

		// As git 2.48 and later write them with --relative-paths.
		testharness.HostGit(repo, "worktree", "add", "-q", "--no-checkout", "-b", "rel", ".worktrees/rel")
		wtHost := filepath.Join(repo, ".worktrees", "rel")
		Expect(os.WriteFile(filepath.Join(wtHost, ".git"), []byte("gitdir: ../../.git/worktrees/rel\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(repo, ".git", "worktrees", "rel", "gitdir"), []byte("../../../.worktrees/rel/.git\n"), 0o644)).To(Succeed())
		giveToAgent(mountDir, agent)

		c := newClaim(ns, "rel", "gitty")
		c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app", Ref: "rel"}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Eventually(claimStatus(ns, "rel"), timeout).Should(And(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)),
			HaveField("Worktree.RelativePaths", BeTrue()),
		))
		Consistently(sandboxStatus(ns, "gitty"), 2*time.Second).Should(HaveField("MountedGitDirs", BeEmpty()),
			"relative links need no git directory at its host path")
		code, _, _ := sandboxRun(agent, "sh", "-c", "test -e "+repo)
		Expect(code).NotTo(Equal(0), "the repository's host path is not inside the sandbox")

		wt := "/workspace/project/app/.worktrees/rel"
		code, out, stderr := sandboxRun(agent, "git", "-C", wt, "status", "--porcelain", "--branch")
		Expect(code).To(Equal(0), stderr)
		Expect(out).To(HavePrefix("## rel"))
		code, _, stderr = sandboxRun(agent, "sh", "-c", "cd "+wt+" && echo relative >> README && git add README && "+
			"git -c user.name=agent -c user.email=agent@example.com commit -q -m 'through relative links'")
		Expect(code).To(Equal(0), stderr)
		Expect(testharness.HostGit(repo, "log", "-1", "--format=%s", "rel")).To(Equal("through relative links"))
		deleteAndWait(c)
		Expect(wtHost).NotTo(BeADirectory(), "clean: removed")
	})
})

// Issue 13's attacks on host git, through the controller: what an agent
// plants in its repository's git directory is refused with a reason, leaks
// nothing, and holds no worker.
var _ = Describe("Host git on an agent's repository", Ordered, func() {
	var ns, mountDir, repo, secret string
	const agent = "hostile"

	BeforeAll(func() {
		testenv.Binary(GinkgoT(), "git", "install git (hack/install-deps.sh)")
		ns = newNamespace()
		mountDir = filepath.Join(env.Dir, ns, "projects")
		repo = filepath.Join(mountDir, "app")
		newRepo(repo)
		// A root-only host file outside every mount, as /etc/shadow.
		secretDir := filepath.Join(env.Dir, ns, "host")
		Expect(os.MkdirAll(secretDir, 0o700)).To(Succeed())
		secret = filepath.Join(secretDir, "shadow")
		Expect(os.WriteFile(secret, []byte("root:TOPSECRET-5e1d:19000::::::\n"), 0o600)).To(Succeed())

		sb := newSandbox(ns, "hostile", agent, time.Minute)
		sb.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "holder", "hostile"))).To(Succeed())
		giveToAgent(mountDir, agent)
	})

	It("refuses a repository whose config plants a smudge filter and whose alternates links to a root-only host file: nothing of that file shows, the claim says why", func() {
		gitDir := filepath.Join(repo, ".git")
		config, err := os.ReadFile(filepath.Join(gitDir, "config"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(gitDir, "config"), append(config, []byte("[filter \"leak\"]\n\tsmudge = cat "+secret+"\n")...), 0o644)).To(Succeed())
		Expect(os.MkdirAll(filepath.Join(gitDir, "info"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(gitDir, "info", "attributes"), []byte("* filter=leak\n"), 0o644)).To(Succeed())
		Expect(os.Symlink(secret, filepath.Join(gitDir, "objects", "info", "alternates"))).To(Succeed())

		c := claimWithWorktree(ns, "leak", "hostile", "project/app")
		c.Spec.Worktree.Ref = "main"
		Expect(k8s.Create(ctx, c)).To(Succeed())
		var got v1alpha1.SessionClaim
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "leak"}, &got)).To(Succeed())
			ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionWorktreeReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Reason).To(Equal(worktree.ReasonUnsafeRepository))
			g.Expect(ready.Message).To(ContainSubstring("alternates"))
			for _, cond := range got.Status.Conditions {
				g.Expect(cond.Message).NotTo(ContainSubstring("TOPSECRET"), cond.Type)
				g.Expect(len(cond.Message)).To(BeNumerically("<=", 2048), cond.Type)
			}
		}, timeout).Should(Succeed())
		Expect(filepath.WalkDir(mountDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(b)).NotTo(ContainSubstring("TOPSECRET"), p)
			return nil
		})).To(Succeed())
		code, out, _ := sandboxRun(agent, "sh", "-c", "cat /workspace/project/app/.worktrees/*/* 2>/dev/null; cat "+secret+" 2>/dev/null")
		Expect(out).NotTo(ContainSubstring("TOPSECRET"), "exit %d", code)

		deleteAndWait(&got)
		Expect(os.Remove(filepath.Join(gitDir, "objects", "info", "alternates"))).To(Succeed())
		Expect(os.Remove(filepath.Join(gitDir, "info", "attributes"))).To(Succeed())
		Expect(os.WriteFile(filepath.Join(gitDir, "config"), config, 0o644)).To(Succeed())
	})

	It("keeps reconciling other claims while more claims than there are claim workers are poisoned with FIFOs", func() {
		// The suite's manager runs the default 16 claim workers.
		const poisoned = 17
		for i := range poisoned {
			name := fmt.Sprintf("p%d", i)
			testharness.HostGit(repo, "worktree", "add", "-q", "--no-checkout", "-b", name, filepath.Join(repo, ".worktrees", name))
		}
		// Planted once all are added: git worktree add reads the other
		// worktrees' HEADs, so the test's own git would block too.
		for i := range poisoned {
			head := filepath.Join(repo, ".git", "worktrees", fmt.Sprintf("p%d", i), "HEAD")
			Expect(os.Remove(head)).To(Succeed())
			Expect(syscall.Mkfifo(head, 0o644)).To(Succeed())
		}
		// Another repository of the same agent: host git refuses the
		// poisoned one as a whole (worktree add reads every worktree's
		// HEAD), but nothing there may hold this one up.
		newRepo(filepath.Join(mountDir, "clean"))
		giveToAgent(mountDir, agent)
		for i := range poisoned {
			c := claimWithWorktree(ns, fmt.Sprintf("p%d", i), "hostile", "project/app")
			c.Spec.Worktree.CreateBranch = false
			Expect(k8s.Create(ctx, c)).To(Succeed())
		}
		Expect(k8s.Create(ctx, claimWithWorktree(ns, "healthy", "hostile", "project/clean"))).To(Succeed())
		Eventually(claimStatus(ns, "healthy"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)))
		for i := range poisoned {
			Eventually(claimStatus(ns, fmt.Sprintf("p%d", i)), timeout).Should(
				HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionFalse, worktree.ReasonUnsafeRepository)))
		}
		// A pass that failed says why but leaves observedGeneration where
		// it was; the pass that succeeded moved it.
		Expect(claimStatus(ns, "healthy")()).To(HaveField("ObservedGeneration", BeEquivalentTo(1)))
		for i := range poisoned {
			Expect(claimStatus(ns, fmt.Sprintf("p%d", i))()).To(HaveField("ObservedGeneration", BeZero()))
		}
	})
})

var _ = Describe("Overlay mounts", func() {
	It("stops a write at an overlay mount's sizeLimit, and turns OverlayHealthy False when a smaller limit is below what the layer holds and True when it shrinks", func() {
		ns := newNamespace()
		src := filepath.Join(env.Dir, ns, "project")
		Expect(os.MkdirAll(src, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n"), 0o644)).To(Succeed())
		sb := newSandbox(ns, "ovl", ns+"-ovl", time.Minute)
		// The sandbox finds only the commands it allows.
		sb.Spec.Binaries = []v1alpha1.BinaryName{"sh", "head", "rm"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay, SizeLimit: ptr.To(resource.MustParse("256Ki"))}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "ovl"))).To(Succeed())
		overlay := func(status metav1.ConditionStatus, reason string) OmegaMatcher {
			return HaveField("Conditions", haveCondition(v1alpha1.ConditionOverlayHealthy, status, reason))
		}
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))

		code, _, _ := sandboxRun(ns+"-ovl", "sh", "-c", "head -c 409600 /dev/zero > /workspace/project/big")
		Expect(code).NotTo(Equal(0), "400 KiB written into an overlay with a 256Ki sizeLimit")
		Expect(filepath.Join(src, "big")).NotTo(BeAnExistingFile(), "the write stays in the upper layer")
		code, _, stderr := sandboxRun(ns+"-ovl", "sh", "-c", "rm /workspace/project/big && head -c 153600 /dev/zero > /workspace/project/big")
		Expect(code).To(Equal(0), stderr)
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))

		By("a limit made smaller than what the layer holds is reported")
		// The controller writes status meanwhile: retry on a conflict.
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
				return err
			}
			sb.Spec.Mounts[0].SizeLimit = ptr.To(resource.MustParse("100Ki"))
			return k8s.Update(ctx, sb)
		}, timeout).Should(Succeed())
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionFalse, v1alpha1.ReasonUpperDirOverLimit))

		code, _, stderr = sandboxRun(ns+"-ovl", "sh", "-c", "rm /workspace/project/big")
		Expect(code).To(Equal(0), stderr)
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))
		deleteAndWait(sb)
	})
})

// quietRuntime is a real driver whose Exec, while lose is set, loses the
// command's output on its way out and still reports its exit status, as a
// transport that drops a stream does.
type quietRuntime struct {
	runtimes.Runtime
	lose atomic.Bool
}

func (q *quietRuntime) Exec(ctx context.Context, name string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	if q.lose.Load() {
		req.Stdout, req.Stderr = io.Discard, io.Discard
	}
	return q.Runtime.Exec(ctx, name, req)
}

// The claim's deletion removes a worktree only on git's word that it is
// clean: an answer lost on the way out of the sandbox is no such word.
var _ = Describe("A worktree whose git status answer is lost on its way out of the sandbox", func() {
	It("is kept with its uncommitted work when the claim goes, not removed as clean", func() {
		testenv.Binary(GinkgoT(), "git", "install git (hack/install-deps.sh)")
		// A manager of its own with its own node name, so the suite's
		// leaves this Sandbox to it.
		const node, agent = "quiet-node", "quiet"
		state := filepath.Join(env.Dir, "state-quiet")
		drv, err := bwrap.New(bwrap.Config{StateDir: state})
		Expect(err).NotTo(HaveOccurred())
		quiet := &quietRuntime{Runtime: drv}
		m := env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: quiet}, controllers.Options{NodeName: node, HealthInterval: time.Second})
		DeferCleanup(func() {
			m.Stop()
			Expect(bwrap.DetachTrees(state)).To(Succeed())
		})

		ns := newNamespace()
		mountDir := filepath.Join(env.Dir, ns, "projects")
		newRepo(filepath.Join(mountDir, "app"))
		sb := newSandbox(ns, "quiet", agent, time.Minute)
		sb.Spec.NodeName = node
		sb.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		DeferCleanup(func() { deleteAndWait(sb) })
		Expect(k8s.Create(ctx, newClaim(ns, "holder", "quiet"))).To(Succeed())
		giveToAgent(mountDir, agent)
		Expect(k8s.Create(ctx, claimWithWorktree(ns, "draft", "quiet", "project/app"))).To(Succeed())
		Eventually(claimStatus(ns, "draft"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))

		var errb bytes.Buffer
		st, err := drv.Exec(ctx, v1alpha1.InstanceName(agent), runtimes.ExecRequest{
			Argv: []string{"sh", "-c", "echo unsaved > /workspace/project/app/.worktrees/draft/draft.txt"}, Stderr: &errb})
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Code).To(Equal(0), errb.String())

		quiet.lose.Store(true)
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "draft"}, &c)).To(Succeed())
		deleteAndWait(&c)
		Expect(os.ReadFile(filepath.Join(c.Status.Worktree.HostPath, "draft.txt"))).To(Equal([]byte("unsaved\n")),
			"git status printed nothing the controller saw: the worktree is kept")
		quiet.lose.Store(false)
	})
})

var _ = Describe("Worktree condition messages", func() {
	It("are cut at 1 KiB when they quote a long repository path and the agent's lock reason", func() {
		testenv.Binary(GinkgoT(), "git", "install git (hack/install-deps.sh)")
		const agent = "verbose"
		ns := newNamespace()
		mountDir := filepath.Join(env.Dir, ns, "projects")
		// The tenant names the repository (up to 1024 characters), the
		// agent makes its directories and writes the lock reason.
		long := strings.Repeat(strings.Repeat("d", 240)+"/", 4) + "app"
		newRepo(filepath.Join(mountDir, long))
		sb := newSandbox(ns, "verbose", agent, time.Minute)
		sb.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		giveToAgent(mountDir, agent)
		c := claimWithWorktree(ns, "long-path", "verbose", "project/"+long)
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Eventually(claimStatus(ns, "long-path"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))

		locked := "/workspace/project/" + long + "/.git/worktrees/long-path/locked"
		code, _, stderr := sandboxRun(agent, "sh", "-c", "printf '%04096d' 0 > "+locked)
		Expect(code).To(Equal(0), stderr)
		Eventually(claimStatus(ns, "long-path"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionFalse, v1alpha1.ReasonWorktreeLocked)))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(c), c)).To(Succeed())
		sizes := map[string]int{}
		for _, cond := range c.Status.Conditions {
			sizes[cond.Type] = len(cond.Message)
		}
		Expect(sizes).To(HaveEach(BeNumerically("<=", 1024+len("…"))), "message sizes")
		Expect(meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionGitHealthy).Message).To(
			HavePrefix("worktree " + c.Status.Worktree.HostPath[:100]))
		deleteAndWait(c)
	})
})
