//go:build e2e

package containerd_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// The boundary specs drive the driver directly, in a containerd namespace
// of their own, so that the controllers' orphan collection never meets
// their containers, and so that a container can be stopped and started
// thousands of times without a Sandbox in between.
const boundaryNamespace = "sandbox-controller-e2e-boundary"

var _ = Describe("containerd mount destinations against the agent", Ordered, func() {
	var (
		d         *containerd.Runtime
		img       string
		areasRoot string
		helper    string
	)

	BeforeAll(func() {
		var err error
		ce := testenv.ContainerdEnv(GinkgoT(), true)
		d, err = containerd.New(ctx, containerd.Config{Address: ce.Address, Namespace: boundaryNamespace, FIFODir: ce.FIFODir})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(d.Close)
		img = importImage(d, ce.ImageTar)
		// Searchable by the agents' ids, as an areas root on a host is.
		areasRoot = filepath.Join(sharedDir(), "areas")
		helper = buildExchange()
	})

	// instance describes a container for agent with mounts, removed with
	// its trees after the spec.
	instance := func(agent string, mounts ...v1alpha1.Mount) runtimes.Instance {
		spec := &v1alpha1.SandboxSpec{
			Agent:      agent,
			Backend:    v1alpha1.BackendContainerd,
			Binaries:   []v1alpha1.BinaryName{"sh", "cat", "mv", "ln", "mkdir", "rm", "ls"},
			Containerd: &v1alpha1.ContainerdSpec{Image: img},
			Mounts:     mounts,
		}
		in, err := testharness.DescribeAs(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "boundary", Name: agent}, Spec: *spec}, instance.Host{AreasRoot: areasRoot})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(d.Delete(ctx, in.Name)).To(Succeed()) })
		return in
	}
	sh := func(in runtimes.Instance, script string) (int, string) {
		var out bytes.Buffer
		st, err := d.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
		Expect(err).NotTo(HaveOccurred())
		return st.Code, out.String()
	}
	ensureRunning := func(in runtimes.Instance) {
		st, err := d.Ensure(ctx, in)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Running).To(BeTrue())
	}
	taskPid := func(in runtimes.Instance) uint32 {
		c, err := d.Client()
		Expect(err).NotTo(HaveOccurred())
		nctx := namespaces.WithNamespace(ctx, boundaryNamespace)
		cont, err := c.LoadContainer(nctx, in.Name)
		Expect(err).NotTo(HaveOccurred())
		task, err := cont.Task(nctx, nil)
		Expect(err).NotTo(HaveOccurred())
		return task.Pid()
	}
	kill := func(in runtimes.Instance) {
		c, err := d.Client()
		Expect(err).NotTo(HaveOccurred())
		nctx := namespaces.WithNamespace(ctx, boundaryNamespace)
		cont, err := c.LoadContainer(nctx, in.Name)
		Expect(err).NotTo(HaveOccurred())
		task, err := cont.Task(nctx, nil)
		Expect(err).NotTo(HaveOccurred())
		exited, err := task.Wait(nctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(task.Kill(nctx, syscall.SIGKILL)).To(Succeed())
		Eventually(exited, timeout).Should(Receive())
	}

	// The attack of issue 12 on this backend: the agent turns the path of
	// the first custom mount's destination into links (src -> stage,
	// stage/app -> a host directory holding the second mount's source) and
	// plants a link to / in the first mount's source. runc bound each
	// mount at its path inside the workspace, following those links.
	It("binds no custom mount through links the agent left on its destination's path", func() {
		hostDir := sharedDir()
		secret := filepath.Join(hostDir, "secret")
		Expect(os.WriteFile(secret, []byte("HOST-SECRET\n"), 0o600)).To(Succeed())
		appSrc := filepath.Join(hostDir, "app")
		toolsParent := filepath.Join(hostDir, "tools-parent")
		toolsSrc := filepath.Join(toolsParent, "tools")
		for _, dir := range []string{appSrc, toolsSrc} {
			Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		}
		in := instance("bnd-linked",
			v1alpha1.Mount{Source: appSrc, Target: "src/app", Mode: v1alpha1.MountReadWrite},
			v1alpha1.Mount{Source: toolsSrc, Target: "tools", Mode: v1alpha1.MountReadWrite})
		giveTo(in.Identity.UID, appSrc, toolsSrc)
		ensureRunning(in)

		code, out := sh(in, fmt.Sprintf(`set -e
mv /workspace/src /workspace/src.moved
mkdir -p /workspace/stage
ln -s %[1]s /workspace/stage/app
ln -sfn stage /workspace/src
ln -s / /workspace/src.moved/app/tools`, toolsParent))
		Expect(code).To(Equal(0), out)
		noEscape := func() {
			GinkgoHelper()
			Expect(os.ReadFile(secret)).To(Equal([]byte("HOST-SECRET\n")))
			Expect(filepath.Join(hostDir, "planted")).NotTo(BeAnExistingFile(), "a file was written on the host through a redirected bind")
			Expect(isMountPoint(toolsParent)).To(BeFalse(), "a bind landed on the host where a link pointed")
			Expect(isMountPoint(toolsSrc)).To(BeFalse(), "a bind landed on the host where a link pointed")
		}
		attempt := func() {
			GinkgoHelper()
			code, out := sh(in, fmt.Sprintf(`cat /workspace/tools%[1]s %[1]s /workspace/src/app/tools%[1]s; echo owned > /workspace/tools%[2]s/planted; echo owned > %[2]s/planted`, secret, hostDir))
			Expect(out).NotTo(ContainSubstring("HOST-SECRET"))
			Expect(code).NotTo(Equal(0), out)
			noEscape()
		}

		By("commands in the running container see nothing of the host")
		attempt()

		for _, restart := range []string{"a killed task", "a stop"} {
			By("the next start after " + restart + " is refused, naming the link")
			if restart == "a stop" {
				Expect(d.Stop(ctx, in.Name)).To(Succeed())
			} else {
				kill(in)
			}
			_, err := d.Ensure(ctx, in)
			if err == nil {
				Expect(mountsOutside(taskPid(in), "/workspace/", appSrc, toolsSrc)).To(BeEmpty(), "a custom mount was bound outside the workspace")
				attempt()
			}
			Expect(err).To(MatchError(ContainSubstring("symbolic link")))
			noEscape()
		}

		By("repaired from the host, the container starts with every mount at its destination")
		repair(in, areasRoot, appSrc)
		ensureRunning(in)
		code, out = sh(in, `echo ok > /workspace/src/app/back && echo ok > /workspace/tools/back && ls /workspace/tools`)
		Expect(code).To(Equal(0), out)
		Expect(os.ReadFile(filepath.Join(appSrc, "back"))).To(Equal([]byte("ok\n")))
		Expect(os.ReadFile(filepath.Join(toolsSrc, "back"))).To(Equal([]byte("ok\n")))
		Expect(mountsOutside(taskPid(in), "/workspace/", appSrc, toolsSrc)).To(BeEmpty())
		noEscape()
	})

	// The review's sequences on this backend: the agent replaces a
	// component of another mount's source path (inside its rw mount) with
	// a link to a host directory, or a mount source's path leads through a
	// /proc magic link. The next start used to build the tree by path,
	// following both. Now every source is resolved beneath its anchor from
	// a held directory: the start is refused, naming why, and nothing of
	// the host directory is bound.
	It("binds no mount source through a link swapped into its path, nor through a /proc magic link", func() {
		hostDir := sharedDir()
		team := filepath.Join(hostDir, "team")
		src := filepath.Join(team, "a", "src")
		decoy := filepath.Join(hostDir, "decoy")
		for _, dir := range []string{src, filepath.Join(decoy, "src")} {
			Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		}
		Expect(os.WriteFile(filepath.Join(src, "marker"), []byte("MOUNT\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(decoy, "src", "marker"), []byte("HOST\n"), 0o644)).To(Succeed())
		in := instance("bnd-swapsrc",
			v1alpha1.Mount{Source: team, Target: "team", Mode: v1alpha1.MountReadWrite},
			v1alpha1.Mount{Source: src, Target: "src", Mode: v1alpha1.MountReadWrite})
		giveTo(in.Identity.UID, team)
		ensureRunning(in)
		code, out := sh(in, fmt.Sprintf(`mv /workspace/team/a /workspace/team/a.real && ln -s %s /workspace/team/a && cat /workspace/src/marker`, decoy))
		Expect(code).To(Equal(0), out)
		Expect(out).To(Equal("MOUNT\n"), "the running container keeps the source it was started with")

		Expect(d.Stop(ctx, in.Name)).To(Succeed())
		_, err := d.Ensure(ctx, in)
		if err == nil {
			_, out = sh(in, `cat /workspace/src/marker; echo owned > /workspace/src/planted`)
			Expect(out).NotTo(ContainSubstring("HOST"))
		}
		Expect(err).To(MatchError(ContainSubstring("symbolic link")))
		Expect(filepath.Join(decoy, "src", "planted")).NotTo(BeAnExistingFile())
		Expect(isMountPoint(filepath.Join(decoy, "src"))).To(BeFalse())

		By("a source through /proc/<pid>/root is refused, naming the magic link")
		peek := filepath.Join(hostDir, "peek")
		Expect(os.Symlink(fmt.Sprintf("/proc/%d/root%s", os.Getpid(), decoy), peek)).To(Succeed())
		magic := instance("bnd-magic", v1alpha1.Mount{Source: peek, Target: "peek", Mode: v1alpha1.MountReadWrite})
		_, err = d.Ensure(ctx, magic)
		Expect(err).To(MatchError(ContainSubstring("magic link")))
		Expect(runtimes.ReasonOf(err)).To(Equal(runtimes.ReasonMountSourceMissing))
	})

	// Agent processes swap a mount destination's parent with links (to the
	// container's / and to a host directory) with renameat2(RENAME_EXCHANGE)
	// in a loop, inside the container while commands start, and on the host
	// workspace (as the agent's id: a process of the agent that outlives
	// the task, in another sandbox over the same area) while the container
	// is restarted. No start may put the mount anywhere but inside the
	// workspace, nor anything on the host directory.
	It("keeps every mount inside the workspace while the agent exchanges its parent with links", func() {
		hostDir := sharedDir()
		src := filepath.Join(hostDir, "src")
		decoy := filepath.Join(hostDir, "decoy", "b")
		tools := filepath.Join(hostDir, "tools")
		for _, dir := range []string{src, decoy, tools} {
			Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		}
		Expect(os.WriteFile(filepath.Join(src, "marker"), []byte("MOUNT\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(decoy, "marker"), []byte("HOST\n"), 0o644)).To(Succeed())
		Expect(copyFile(helper, filepath.Join(tools, "exchange"))).To(Succeed())
		in := instance("bnd-race",
			v1alpha1.Mount{Source: src, Target: "a/b", Mode: v1alpha1.MountReadOnly},
			v1alpha1.Mount{Source: tools, Target: "tools", Mode: v1alpha1.MountReadOnly})
		ensureRunning(in)
		targets := []string{"/", filepath.Dir(decoy), "/memories"}
		var escapes atomic.Int64

		By("commands start while swappers inside the container exchange /workspace/a")
		swapCtx, stopSwapping := context.WithCancel(ctx)
		var swappers sync.WaitGroup
		for i := range 2 {
			swappers.Add(1)
			go func() {
				defer GinkgoRecover()
				defer swappers.Done()
				order := append(targets[i:], targets[:i]...)
				_, _ = d.Exec(swapCtx, in.Name, runtimes.ExecRequest{Argv: append([]string{"sh", "-c", `exec /workspace/tools/exchange "$@"`, "exchange", "/workspace", "a", fmt.Sprintf("c%d-", i)}, order...)})
			}()
		}
		starts := testenv.RaceStarts(500)
		var next, ran atomic.Int64
		var workers sync.WaitGroup
		for range 4 {
			workers.Add(1)
			go func() {
				defer GinkgoRecover()
				defer workers.Done()
				for next.Add(1) <= int64(starts) {
					var out bytes.Buffer
					st, err := d.Exec(ctx, in.Name, runtimes.ExecRequest{
						Argv: []string{"cat", "/workspace/a/b/marker"}, Stdout: &out, Stderr: &bytes.Buffer{}})
					if strings.Contains(out.String(), "HOST") {
						escapes.Add(1)
					}
					if err == nil && st.Code == 0 && out.String() == "MOUNT\n" {
						ran.Add(1)
					}
				}
			}()
		}
		workers.Wait()
		stopSwapping()
		swappers.Wait()
		Expect(mountsOutside(taskPid(in), "/workspace/", src)).To(BeEmpty())
		fmt.Fprintf(GinkgoWriter, "%d command starts, %d saw the mount, %d escapes\n", starts, ran.Load(), escapes.Load())

		By("the container restarts while a process of the agent exchanges a on the host")
		// Stopped first: a swapper whose exec was cancelled may still be
		// running in the container, and would move a again under putBack.
		Expect(d.Stop(ctx, in.Name)).To(Succeed())
		ws := filepath.Join(areasRoot, in.Agent, "workspace")
		putBack(ws, "a", "c0-0", "c0-1", "c0-2", "c1-0", "c1-1", "c1-2")
		// The copy in tools: the agent's id may run it.
		swapper := exec.Command(filepath.Join(tools, "exchange"), append([]string{ws, "a", "h"}, targets...)...)
		swapper.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: in.Identity.UID, Gid: in.Identity.GID}}
		var swapErr bytes.Buffer
		swapper.Stderr = &swapErr
		Expect(swapper.Start()).To(Succeed())
		DeferCleanup(func() { _ = swapper.Process.Kill(); _ = swapper.Wait() })
		Eventually(func() error { _, err := os.Lstat(filepath.Join(ws, "h2")); return err }, timeout).Should(Succeed(), swapErr.String)
		budget, maxRestarts := 20*time.Second, 50
		if starts >= testenv.FullRaceStarts {
			budget, maxRestarts = 3*time.Minute, 1<<30
		}
		var restarts, started, refused int
		var failures []string
		for deadline := time.Now().Add(budget); time.Now().Before(deadline) && restarts < maxRestarts; restarts++ {
			Expect(d.Stop(ctx, in.Name)).To(Succeed())
			if _, err := d.Ensure(ctx, in); err != nil {
				if strings.Contains(err.Error(), "symbolic link") {
					refused++
				} else {
					failures = append(failures, err.Error())
				}
				continue
			}
			started++
			if out := mountsOutside(taskPid(in), "/workspace/", src); len(out) > 0 {
				escapes.Add(1)
				fmt.Fprintf(GinkgoWriter, "restart %d: the mount is at %q\n", restarts, out)
			}
			var out bytes.Buffer
			_, _ = d.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"cat", "/workspace/a/b/marker", filepath.Join(filepath.Dir(decoy), "b", "marker"), "/b/marker"}, Stdout: &out, Stderr: &bytes.Buffer{}})
			if strings.Contains(out.String(), "HOST") {
				escapes.Add(1)
			}
		}
		Expect(swapper.Process.Kill()).To(Succeed())
		_ = swapper.Wait()
		fmt.Fprintf(GinkgoWriter, "%d restarts: %d started, %d refused for a link, %d escapes in all\n", restarts, started, refused, escapes.Load())
		AddReportEntry("containerd exchange race", fmt.Sprintf("%d command starts (%d saw the mount), %d restarts (%d started, %d refused for a link), %d escapes",
			starts, ran.Load(), restarts, started, refused, escapes.Load()))
		Expect(escapes.Load()).To(BeZero())
		Expect(failures).To(BeEmpty(), "starts that failed for another reason than a link")
		Expect(isMountPoint(decoy)).To(BeFalse())
		Expect(isMountPoint(filepath.Dir(decoy))).To(BeFalse())
		Expect(os.ReadFile(filepath.Join(decoy, "marker"))).To(Equal([]byte("HOST\n")))
	})
})

// repair undoes the agent's links on the host, as an administrator (or the
// file API) would: the container cannot start until they are gone.
func repair(in runtimes.Instance, areasRoot, appSrc string) {
	GinkgoHelper()
	ws := filepath.Join(areasRoot, in.Agent, "workspace")
	Expect(os.Remove(filepath.Join(ws, "src"))).To(Succeed())
	Expect(os.RemoveAll(filepath.Join(ws, "stage"))).To(Succeed())
	Expect(os.Rename(filepath.Join(ws, "src.moved"), filepath.Join(ws, "src"))).To(Succeed())
	Expect(os.Remove(filepath.Join(appSrc, "tools"))).To(Succeed())
}

// sharedDir is a fresh directory every user may search and read, as a
// host directory shared with agents is.
func sharedDir() string {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		Expect(os.Chmod(p, 0o755)).To(Succeed())
	}
	return dir
}

// giveTo makes id the owner of each path and everything beneath it.
func giveTo(id uint32, paths ...string) {
	GinkgoHelper()
	for _, root := range paths {
		Expect(testenv.ChownTree(root, id, id)).To(Succeed())
	}
}

// putBack gives the directory the swappers left under one of names its own
// name again, where a link of theirs may stand.
func putBack(dir, name string, names ...string) {
	GinkgoHelper()
	for _, n := range names {
		fi, err := os.Lstat(filepath.Join(dir, n))
		if err != nil || !fi.IsDir() {
			continue
		}
		Expect(os.Remove(filepath.Join(dir, name))).To(Succeed())
		Expect(os.Rename(filepath.Join(dir, n), filepath.Join(dir, name))).To(Succeed())
	}
	fi, err := os.Lstat(filepath.Join(dir, name))
	Expect(err).NotTo(HaveOccurred())
	Expect(fi.IsDir()).To(BeTrue())
}

// buildExchange builds the static exchange helper (testdata/exchange).
func buildExchange() string {
	GinkgoHelper()
	out := filepath.Join(GinkgoT().TempDir(), "exchange")
	cmd, cancel := testenv.Command(10*time.Minute, "go", "build", "-o", out, "./testdata/exchange")
	defer cancel()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "building the exchange helper: %s", b)
	return out
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// mountsOutside lists the mount points, in the mount namespace of pid,
// of binds of any of sources that are not below prefix. A bind's root in
// mountinfo is its source's path within its file system: a suffix of the
// host path.
func mountsOutside(pid uint32, prefix string, sources ...string) []string {
	GinkgoHelper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[3] == "/" {
			continue
		}
		for _, s := range sources {
			if (s == fields[3] || strings.HasSuffix(s, fields[3]) && strings.HasPrefix(fields[3], "/")) && !strings.HasPrefix(fields[4], prefix) {
				out = append(out, fields[4])
			}
		}
	}
	Expect(sc.Err()).NotTo(HaveOccurred())
	return out
}

// isMountPoint says whether p is a mount point in this process's mount
// namespace: its mount is not its parent's.
func isMountPoint(p string) bool {
	var st, parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		return false
	}
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(p), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &parent); err != nil {
		return false
	}
	return st.Mnt_id != parent.Mnt_id
}
