package controllers_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/testenv"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

func hostGit(dir string, args ...string) string {
	GinkgoHelper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=host", "GIT_AUTHOR_EMAIL=host@example.com", "GIT_COMMITTER_NAME=host", "GIT_COMMITTER_EMAIL=host@example.com")
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// sandboxRun runs argv in the Sandbox's instance through the runtime.
func sandboxRun(agent string, argv ...string) (int, string, string) {
	GinkgoHelper()
	var out, errb bytes.Buffer
	st, err := mgr.rt.Exec(ctx, v1alpha1.InstanceName(agent), runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
	Expect(err).NotTo(HaveOccurred())
	return st.Code, out.String(), errb.String()
}

func claimWithWorktree(ns, name, sandbox, repo string) *v1alpha1.SessionClaim {
	c := newClaim(ns, name, sandbox)
	c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: repo, CreateBranch: true}
	return c
}

var _ = Describe("Session worktrees", Ordered, func() {
	var ns, mountDir, repo string
	const agent = "gitty"

	BeforeAll(func() {
		testenv.Binary(GinkgoT(), "git", "install git (hack/install-deps.sh)")
		ns = newNamespace()
		mountDir = filepath.Join(env.Dir, "projects")
		repo = filepath.Join(mountDir, "app")
		Expect(os.MkdirAll(repo, 0o755)).To(Succeed())
		hostGit(repo, "init", "-q", "-b", "main")
		Expect(os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)).To(Succeed())
		hostGit(repo, "add", "README")
		hostGit(repo, "commit", "-q", "-m", "first")

		sb := newSandbox(ns, "gitty", agent, time.Minute)
		sb.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
	})

	It("adds a worktree, checks it out inside, and git works there with commits visible on the host", func() {
		Expect(k8s.Create(ctx, claimWithWorktree(ns, "s1", "gitty", "project/app"))).To(Succeed())
		Eventually(claimStatus(ns, "s1"), timeout).Should(And(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)),
			HaveField("Worktree.Path", "/workspace/project/app/.worktrees/s1"),
			HaveField("Worktree.Branch", "s1"),
		))
		Eventually(sandboxStatus(ns, "gitty"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)))

		wt := "/workspace/project/app/.worktrees/s1"
		code, out, stderr := sandboxRun(agent, "git", "-C", wt, "status", "--porcelain", "--branch")
		Expect(code).To(Equal(0), stderr)
		Expect(out).To(HavePrefix("## s1"))
		code, _, stderr = sandboxRun(agent, "sh", "-c", "cd "+wt+" && echo change >> README && git add README && "+
			"git -c user.name=agent -c user.email=agent@example.com commit -q -m 'from the sandbox'")
		Expect(code).To(Equal(0), stderr)
		Expect(hostGit(repo, "log", "-1", "--format=%s", "s1")).To(Equal("from the sandbox"))
	})

	It("leaves the repository's other worktrees alone when git gc runs inside", func() {
		other := filepath.Join(env.Dir, "elsewhere", "other-wt")
		hostGit(repo, "worktree", "add", "-q", "-b", "other", other)
		// Old enough that gc with git's default expiry would prune it.
		admin := filepath.Join(repo, ".git", "worktrees", "other-wt")
		entries, err := os.ReadDir(admin)
		Expect(err).NotTo(HaveOccurred())
		old := time.Now().AddDate(-2, 0, 0)
		for _, e := range entries {
			Expect(os.Chtimes(filepath.Join(admin, e.Name()), old, old)).To(Succeed())
		}
		// The sandbox does not mount other's directory, so to git inside it
		// looks gone; only disabled worktree pruning keeps gc from dropping it.
		code, _, stderr := sandboxRun(agent, "git", "-C", "/workspace/project/app/.worktrees/s1", "gc", "--quiet")
		Expect(code).To(Equal(0), stderr)
		Expect(hostGit(repo, "worktree", "list", "--porcelain")).To(ContainSubstring(other))
		Expect(admin).To(BeADirectory())
	})

	It("reports a locked worktree as WorktreeLocked on the claim and the Sandbox", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		hostGit(repo, "worktree", "lock", "--reason", "moved to a laptop", c.Status.Worktree.HostPath)
		Eventually(claimStatus(ns, "s1"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionFalse, v1alpha1.ReasonWorktreeLocked)))
		Eventually(sandboxStatus(ns, "gitty"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionFalse, v1alpha1.ReasonWorktreeLocked)))
		hostGit(repo, "worktree", "unlock", c.Status.Worktree.HostPath)
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

	It("removes a clean worktree when its claim goes and keeps the branch", func() {
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, &c)).To(Succeed())
		path := c.Status.Worktree.HostPath
		deleteAndWait(&c)
		Expect(path).NotTo(BeADirectory())
		Expect(hostGit(repo, "log", "-1", "--format=%s", "s1")).To(Equal("from the sandbox"))
		Expect(hostGit(repo, "worktree", "list", "--porcelain")).NotTo(ContainSubstring(path))
	})

	It("keeps a worktree with uncommitted changes and still completes the claim's deletion", func() {
		Expect(k8s.Create(ctx, claimWithWorktree(ns, "s2", "gitty", "project/app"))).To(Succeed())
		Eventually(claimStatus(ns, "s2"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)))
		code, _, stderr := sandboxRun(agent, "sh", "-c", "echo unsaved > /workspace/project/app/.worktrees/s2/draft.txt")
		Expect(code).To(Equal(0), stderr)

		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s2"}, &c)).To(Succeed())
		path := c.Status.Worktree.HostPath
		deleteAndWait(&c)
		Expect(os.ReadFile(filepath.Join(path, "draft.txt"))).To(Equal([]byte("unsaved\n")))
	})

	It("takes a worktree with relative links as it is: no git directory at its host path, git works through the mount", func() {
		// As git 2.48 and later write them with --relative-paths.
		hostGit(repo, "worktree", "add", "-q", "--no-checkout", "-b", "rel", ".worktrees/rel")
		wtHost := filepath.Join(repo, ".worktrees", "rel")
		Expect(os.WriteFile(filepath.Join(wtHost, ".git"), []byte("gitdir: ../../.git/worktrees/rel\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(repo, ".git", "worktrees", "rel", "gitdir"), []byte("../../../.worktrees/rel/.git\n"), 0o644)).To(Succeed())

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
		Expect(hostGit(repo, "log", "-1", "--format=%s", "rel")).To(Equal("through relative links"))
		deleteAndWait(c)
		Expect(wtHost).NotTo(BeADirectory(), "clean: removed")
	})
})

var _ = Describe("Overlay mounts", func() {
	It("turns OverlayHealthy False when an overlay mount's upper layer exceeds its sizeLimit and True when it shrinks", func() {
		ns := newNamespace()
		src := filepath.Join(env.Dir, ns, "project")
		Expect(os.MkdirAll(src, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n"), 0o644)).To(Succeed())
		sb := newSandbox(ns, "ovl", ns+"-ovl", time.Minute)
		sb.Spec.Binaries = []v1alpha1.BinaryName{"sh"}
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay, SizeLimit: ptr.To(resource.MustParse("100Ki"))}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "ovl"))).To(Succeed())
		overlay := func(status metav1.ConditionStatus, reason string) OmegaMatcher {
			return HaveField("Conditions", haveCondition(v1alpha1.ConditionOverlayHealthy, status, reason))
		}
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))

		code, _, stderr := sandboxRun(ns+"-ovl", "sh", "-c", "head -c 204800 /dev/zero > /workspace/project/big")
		Expect(code).To(Equal(0), stderr)
		Expect(filepath.Join(src, "big")).NotTo(BeAnExistingFile(), "the write stays in the upper layer")
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionFalse, v1alpha1.ReasonUpperDirOverLimit))

		code, _, stderr = sandboxRun(ns+"-ovl", "sh", "-c", "rm /workspace/project/big")
		Expect(code).To(Equal(0), stderr)
		Eventually(sandboxStatus(ns, "ovl"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))
		deleteAndWait(sb)
	})
})
