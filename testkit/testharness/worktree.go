package testharness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// GiveToAgent hands dir to the agent's host identity (the owner of its
// directory in the areas root, once the controller made it), as an
// administrator gives an agent its project: the agent's commands and the
// controller's host git both run as that identity, never as root. The
// directories above dir, up to e.Dir, are opened for it to reach dir.
func GiveToAgent(e *Env, dir, agent string) {
	GinkgoHelper()
	var fi os.FileInfo
	Eventually(func() (err error) {
		fi, err = os.Stat(filepath.Join(e.AreasRoot, agent))
		if err == nil && fi.Sys().(*syscall.Stat_t).Uid == 0 {
			err = fmt.Errorf("%s is still root's: the agent has no identity yet", fi.Name())
		}
		return err
	}, Timeout).Should(Succeed(), "the agent's directory records its identity")
	st := fi.Sys().(*syscall.Stat_t)
	Expect(testenv.ChownTree(dir, st.Uid, st.Gid)).To(Succeed())
	for d := filepath.Dir(dir); strings.HasPrefix(d, e.Dir); d = filepath.Dir(d) {
		Expect(os.Chmod(d, 0o755)).To(Succeed())
	}
}

// WorktreeSuite is what the shared worktree specs need of a backend's suite.
type WorktreeSuite struct {
	Env func() *Env
	// NewSandbox is a Sandbox of the backend with the given agent; the
	// specs add the binaries and the mount they need.
	NewSandbox func(ns, name, agent string) *v1alpha1.Sandbox
	// Runtime is the driver the controller uses, for exec.
	Runtime func() runtimes.Runtime
}

// HostGit runs git on the host in dir with a fixed identity and returns its
// trimmed output.
func HostGit(dir string, args ...string) string {
	GinkgoHelper()
	// The repositories belong to the agents (GiveToAgent), not to root.
	gctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(gctx, "git", append([]string{"-c", "safe.directory=*", "-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=host", "GIT_AUTHOR_EMAIL=host@example.com", "GIT_COMMITTER_NAME=host", "GIT_COMMITTER_EMAIL=host@example.com")
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// DescribeWorktrees registers the worktree specs: a claim's worktree added
// on the host, checked out and used by git inside the backend's sandbox,
// with the commits visible on the host; git gc inside leaves the
// repository's other worktrees alone; a clean worktree goes with its
// claim, a dirty one stays. The worktree's claim arrives while another
// claim keeps the sandbox running, so its git directory must be bound
// without a restart.
func DescribeWorktrees(backend string, s WorktreeSuite) bool {
	return Describe(backend+" session worktrees", Ordered, func() {
		var (
			e                         *Env
			ns, mountDir, repo, agent string
			ctx                       = context.Background()
			wtPath                    = "/workspace/project/app/.worktrees/s1"
		)
		inSandbox := func(argv ...string) (int, string, string) {
			GinkgoHelper()
			var out, errb bytes.Buffer
			st, err := s.Runtime().Exec(ctx, v1alpha1.InstanceName(agent), runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
			Expect(err).NotTo(HaveOccurred())
			return st.Code, out.String(), errb.String()
		}
		claim := func(name string, worktree bool) *v1alpha1.SessionClaim {
			c := NewClaim(ns, name, "gitty")
			if worktree {
				c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app", CreateBranch: true}
			}
			return c
		}
		claimOf := func(name string) *v1alpha1.SessionClaim {
			GinkgoHelper()
			var c v1alpha1.SessionClaim
			Expect(e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &c)).To(Succeed())
			return &c
		}

		BeforeAll(func() {
			testenv.Binary(GinkgoT(), "git", "install git (hack/install-deps.sh)")
			e = s.Env()
			ns = e.NewNamespace()
			agent = ns + "-git"
			mountDir = filepath.Join(e.Dir, ns, "projects")
			repo = filepath.Join(mountDir, "app")
			Expect(os.MkdirAll(repo, 0o755)).To(Succeed())
			HostGit(repo, "init", "-q", "-b", "main")
			Expect(os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)).To(Succeed())
			HostGit(repo, "add", "README")
			HostGit(repo, "commit", "-q", "-m", "first")

			sb := s.NewSandbox(ns, "gitty", agent)
			sb.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh", "cat"}
			sb.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
			sb.Spec.IdleTimeout = &metav1.Duration{Duration: time.Minute}
			Expect(e.Client.Create(ctx, sb)).To(Succeed())
			By("a claim without a worktree starts the sandbox")
			Expect(e.Client.Create(ctx, claim("holder", false))).To(Succeed())
			Eventually(e.SandboxStatus(ns, "gitty"), Timeout).Should(SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
			GiveToAgent(e, mountDir, agent)
		})
		AfterAll(func() {
			if e == nil || ns == "" {
				return
			}
			var c v1alpha1.SessionClaim
			if e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "holder"}, &c) == nil {
				e.DeleteAndWait(&c)
			}
			var sb v1alpha1.Sandbox
			if e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gitty"}, &sb) == nil {
				e.DeleteAndWait(&sb)
			}
		})

		It("adds a worktree to the running sandbox, checks it out inside, and git works there with commits visible on the host", func() {
			Expect(e.Client.Create(ctx, claim("s1", true))).To(Succeed())
			Eventually(e.ClaimStatus(ns, "s1"), Timeout).Should(And(
				HaveField("Conditions", HaveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)),
				HaveField("Conditions", HaveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)),
				HaveField("Worktree.Path", wtPath),
				HaveField("Worktree.Branch", "s1"),
			))
			Eventually(e.SandboxStatus(ns, "gitty"), Timeout).Should(And(
				HaveField("Conditions", HaveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)),
				HaveField("MountedGitDirs", ConsistOf(filepath.Join(repo, ".git"))),
			))
			sb, err := e.SandboxStatus(ns, "gitty")()
			Expect(err).NotTo(HaveOccurred())
			Expect(meta.FindStatusCondition(sb.Conditions, v1alpha1.ConditionReady).Reason).To(Equal(v1alpha1.ReasonRunning),
				"the git directory is bound while the holder's claim keeps the sandbox running: no restart")

			code, out, stderr := inSandbox("git", "-C", wtPath, "status", "--porcelain", "--branch")
			Expect(code).To(Equal(0), "git status in the worktree; stdout %q, stderr %q", out, stderr)
			Expect(out).To(HavePrefix("## s1"))
			code, out, stderr = inSandbox("cat", wtPath+"/README")
			Expect(code).To(Equal(0), stderr)
			Expect(out).To(Equal("hello\n"), "checked out inside")
			code, _, stderr = inSandbox("sh", "-c", "cd "+wtPath+" && echo change >> README && git add README && "+
				"git -c user.name=agent -c user.email=agent@example.com commit -q -m 'from the sandbox'")
			Expect(code).To(Equal(0), stderr)
			Expect(HostGit(repo, "log", "-1", "--format=%s", "s1")).To(Equal("from the sandbox"))
			Expect(HostGit(repo, "fsck", "--no-progress")).To(BeEmpty(), "objects written inside are whole")
		})

		It("leaves the repository's other worktrees alone when git gc runs inside", func() {
			other := filepath.Join(e.Dir, ns, "elsewhere", "other-wt")
			HostGit(repo, "worktree", "add", "-q", "-b", "other", other)
			// Added by root on the host: the agent's git inside must lock
			// its refs as it would for a worktree the agent added.
			GiveToAgent(e, repo, agent)
			admin := filepath.Join(repo, ".git", "worktrees", "other-wt")
			entries, err := os.ReadDir(admin)
			Expect(err).NotTo(HaveOccurred())
			old := time.Now().AddDate(-2, 0, 0)
			for _, en := range entries {
				Expect(os.Chtimes(filepath.Join(admin, en.Name()), old, old)).To(Succeed())
			}
			code, _, stderr := inSandbox("git", "-C", wtPath, "gc", "--quiet")
			Expect(code).To(Equal(0), stderr)
			Expect(HostGit(repo, "worktree", "list", "--porcelain")).To(ContainSubstring(other))
			Expect(admin).To(BeADirectory())
		})

		It("binds the git directory when a worktree claim is the one that starts its sandbox", func() {
			cold := s.NewSandbox(ns, "gitty-cold", agent+"-cold")
			cold.Spec.Binaries = []v1alpha1.BinaryName{"git", "sh", "cat"}
			cold.Spec.Mounts = []v1alpha1.Mount{{Source: mountDir, Target: "project", Mode: v1alpha1.MountReadWrite}}
			Expect(e.Client.Create(ctx, cold)).To(Succeed())
			DeferCleanup(func() { e.DeleteAndWait(cold) })
			Eventually(e.SandboxStatus(ns, "gitty-cold"), Timeout).Should(SandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
			c := NewClaim(ns, "first", "gitty-cold")
			c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "project/app", CreateBranch: true}
			Expect(e.Client.Create(ctx, c)).To(Succeed())
			// Another agent: the project is handed to it for this spec
			// and back afterwards.
			GiveToAgent(e, mountDir, agent+"-cold")
			DeferCleanup(func() { GiveToAgent(e, mountDir, agent) })
			Eventually(e.ClaimStatus(ns, "first"), Timeout).Should(And(
				HaveField("Conditions", HaveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)),
				HaveField("Conditions", HaveCondition(v1alpha1.ConditionGitHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)),
			))
			var out, errb bytes.Buffer
			st, err := s.Runtime().Exec(ctx, v1alpha1.InstanceName(agent+"-cold"), runtimes.ExecRequest{
				Argv: []string{"git", "-C", "/workspace/project/app/.worktrees/first", "status", "--porcelain", "--branch"}, Stdout: &out, Stderr: &errb})
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Code).To(Equal(0), errb.String())
			Expect(out.String()).To(HavePrefix("## first"), errb.String())
			e.DeleteAndWait(c)
		})

		It("removes a clean worktree when its claim goes and keeps the branch", func() {
			c := claimOf("s1")
			path := c.Status.Worktree.HostPath
			e.DeleteAndWait(c)
			Expect(path).NotTo(BeADirectory())
			Expect(HostGit(repo, "log", "-1", "--format=%s", "s1")).To(Equal("from the sandbox"))
			Expect(HostGit(repo, "worktree", "list", "--porcelain")).NotTo(ContainSubstring(path))
		})

		It("keeps a worktree with uncommitted changes and still completes the claim's deletion", func() {
			Expect(e.Client.Create(ctx, claim("s2", true))).To(Succeed())
			Eventually(e.ClaimStatus(ns, "s2"), Timeout).Should(
				HaveField("Conditions", HaveCondition(v1alpha1.ConditionWorktreeReady, metav1.ConditionTrue, v1alpha1.ReasonWorktreeCreated)))
			code, _, stderr := inSandbox("sh", "-c", "echo unsaved > /workspace/project/app/.worktrees/s2/draft.txt")
			Expect(code).To(Equal(0), stderr)
			c := claimOf("s2")
			path := c.Status.Worktree.HostPath
			e.DeleteAndWait(c)
			Expect(os.ReadFile(filepath.Join(path, "draft.txt"))).To(Equal([]byte("unsaved\n")))
		})
	})
}
