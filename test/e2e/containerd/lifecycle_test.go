//go:build e2e

package containerd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

const timeout = testharness.Timeout

var (
	newClaim      = testharness.NewClaim
	haveCondition = testharness.HaveCondition
	sandboxIs     = testharness.SandboxIs
)

func newSandbox(ns, name, agent string, idle time.Duration) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.SandboxSpec{
			Agent:       agent,
			Backend:     v1alpha1.BackendContainerd,
			Binaries:    []v1alpha1.BinaryName{"sh", "cat", "true"},
			Containerd:  &v1alpha1.ContainerdSpec{Image: image},
			IdleTimeout: &metav1.Duration{Duration: idle},
		},
	}
}

func recorder() *testharness.Recorder { return mgr.Runtimes[v1alpha1.BackendContainerd] }

// inContainer runs argv in the instance through the driver and returns
// its exit code and stdout.
func inContainer(d runtimes.Runtime, inst string, argv ...string) (int, string) {
	var out, errOut bytes.Buffer
	st, err := d.Exec(ctx, inst, runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errOut})
	Expect(err).NotTo(HaveOccurred())
	return st.Code, out.String() + errOut.String()
}

func inspect(d runtimes.Runtime, inst string) runtimes.State {
	st, err := d.Inspect(ctx, inst)
	Expect(err).NotTo(HaveOccurred())
	return st
}

func workspaceFile(agent, name string) string {
	return filepath.Join(env.AreasRoot, agent, "workspace", name)
}

var _ = Describe("containerd Sandbox lifecycle", func() {
	It("runs one container for all claims, execs into the workspace, and stops it after the last claim", func() {
		ns := env.NewNamespace()
		const idle = 2 * time.Second
		Expect(k8s.Create(ctx, newSandbox(ns, "counted", "ctr-counted", idle))).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-counted")
		Eventually(env.SandboxStatus(ns, "counted"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(inspect(drv, inst).Exists).To(BeFalse(), "no claim, no container")

		By("the first claim makes the container and runs it")
		Expect(k8s.Create(ctx, newClaim(ns, "c1", "counted"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "counted"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(env.ClaimStatus(ns, "c1"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		first := inspect(drv, inst)
		Expect(first.Running).To(BeTrue())
		Expect(first.Owner).To(Equal(ns + "/counted"))

		By("a command writes into the workspace area and the host sees it")
		code, out := inContainer(drv, inst, "sh", "-c", "echo from-container > /workspace/hello; pwd")
		Expect(code).To(Equal(0), out)
		Expect(out).To(Equal("/workspace\n"))
		Expect(os.ReadFile(workspaceFile("ctr-counted", "hello"))).To(Equal([]byte("from-container\n")))

		By("a second claim reuses the running container")
		Expect(k8s.Create(ctx, newClaim(ns, "c2", "counted"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "counted"), timeout).Should(sandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Expect(recorder().Count("Ensure", inst)).To(Equal(1))
		Expect(inspect(drv, inst).CreatedAt).To(Equal(first.CreatedAt))

		By("with no claims left the container stops after idleTimeout and is kept")
		for _, c := range []string{"c1", "c2"} {
			env.DeleteAndWait(newClaim(ns, c, "counted"))
		}
		Eventually(env.SandboxStatus(ns, "counted"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(recorder().Count("Stop", inst)).To(Equal(1))
		st := inspect(drv, inst)
		Expect(st.Exists).To(BeTrue())
		Expect(st.Running).To(BeFalse())
	})

	It("runs commands as the agent's own unprivileged host id, without capabilities, under seccomp and no_new_privs", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "least", "ctr-least", time.Minute)
		sb.Spec.Binaries = append(sb.Spec.Binaries, "id")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-least")
		Expect(k8s.Create(ctx, newClaim(ns, "c", "least"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "least"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		By("the agent's id is the owner of its directory, and not root")
		fi, err := os.Stat(filepath.Join(env.AreasRoot, "ctr-least"))
		Expect(err).NotTo(HaveOccurred())
		owner := fi.Sys().(*syscall.Stat_t)
		Expect(owner.Uid).NotTo(BeZero())
		id := strconv.FormatUint(uint64(owner.Uid), 10)

		By("id inside prints it, for user, group and the only group")
		code, out := inContainer(drv, inst, "sh", "-c", "id -u; id -g; id -G")
		Expect(code).To(Equal(0), out)
		Expect(strings.Fields(out)).To(Equal([]string{id, id, id}))

		By("seccomp filters, no_new_privs is set, no capability is held")
		code, out = inContainer(drv, inst, "cat", "/proc/self/status")
		Expect(code).To(Equal(0), out)
		Expect(out).To(And(
			MatchRegexp(`(?m)^Seccomp:\s+2$`), MatchRegexp(`(?m)^NoNewPrivs:\s+1$`),
			MatchRegexp(`(?m)^CapEff:\s+0+$`), MatchRegexp(`(?m)^CapPrm:\s+0+$`), MatchRegexp(`(?m)^CapBnd:\s+0+$`),
		))

		By("a file the agent writes in /workspace belongs to that id on the host")
		code, out = inContainer(drv, inst, "sh", "-c", "echo mine > /workspace/mine")
		Expect(code).To(Equal(0), out)
		fi, err = os.Stat(workspaceFile("ctr-least", "mine"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Sys().(*syscall.Stat_t).Uid).To(Equal(owner.Uid))
		Expect(fi.Sys().(*syscall.Stat_t).Gid).To(Equal(owner.Uid))

		By("host root's files in the root are not the agent's to change")
		code, _ = inContainer(drv, inst, "sh", "-c", "echo x > /etc/passwd")
		Expect(code).NotTo(Equal(0))
		env.DeleteAndWait(sb)
	})

	It("keeps files written in the container's root across stop and start", func() {
		ns := env.NewNamespace()
		Expect(k8s.Create(ctx, newSandbox(ns, "rooted", "ctr-rooted", time.Second))).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-rooted")
		Expect(k8s.Create(ctx, newClaim(ns, "first", "rooted"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "rooted"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		created := inspect(drv, inst).CreatedAt
		code, out := inContainer(drv, inst, "sh", "-c", "echo installed > /var/tmp/state")
		Expect(code).To(Equal(0), out)

		env.DeleteAndWait(newClaim(ns, "first", "rooted"))
		Eventually(env.SandboxStatus(ns, "rooted"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(inspect(drv, inst).Running).To(BeFalse())

		Expect(k8s.Create(ctx, newClaim(ns, "second", "rooted"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "rooted"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		_, out = inContainer(drv, inst, "cat", "/var/tmp/state")
		Expect(out).To(Equal("installed\n"))
		Expect(inspect(drv, inst).CreatedAt).To(Equal(created), "the container was started again, not made anew")
	})

	It("deletes the container and its snapshot with the Sandbox and keeps the host areas", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "doomed", "ctr-doomed", time.Minute)
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-doomed")
		Expect(k8s.Create(ctx, newClaim(ns, "held", "doomed"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "doomed"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		code, out := inContainer(drv, inst, "sh", "-c", "echo agent-data > /workspace/notes")
		Expect(code).To(Equal(0), out)

		env.DeleteAndWait(sb)
		Expect(inspect(drv, inst).Exists).To(BeFalse())
		c, err := drv.Client()
		Expect(err).NotTo(HaveOccurred())
		_, err = c.SnapshotService(containerd.DefaultSnapshotter).Stat(namespaces.WithNamespace(ctx, e2eNamespace), inst)
		Expect(errdefs.IsNotFound(err)).To(BeTrue(), "snapshot %s should be gone, got %v", inst, err)
		Expect(os.ReadFile(workspaceFile("ctr-doomed", "notes"))).To(Equal([]byte("agent-data\n")))
		for _, a := range runtimes.StandardAreas {
			Expect(filepath.Join(env.AreasRoot, "ctr-doomed", a.Name)).To(BeADirectory())
		}
	})

	It("removes a container whose Sandbox is gone and keeps its areas", func() {
		spec := &v1alpha1.SandboxSpec{Agent: "ctr-orphan", Backend: v1alpha1.BackendContainerd, Containerd: &v1alpha1.ContainerdSpec{Image: image}}
		orphan, err := testharness.DescribeAs(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "gone", Name: "orphan"}, Spec: *spec}, instance.Host{AreasRoot: env.AreasRoot})
		Expect(err).NotTo(HaveOccurred())
		// Made while no controller runs, as after a Sandbox deleted behind
		// its back: a running collector could remove it mid-Ensure.
		mgr.Stop()
		Expect(drv.Ensure(ctx, orphan)).To(HaveField("Running", true))
		mgr = startManager()

		Eventually(func() bool { return inspect(drv, orphan.Name).Exists }, timeout).Should(BeFalse())
		Expect(recorder().Count("Delete", orphan.Name)).To(BeNumerically(">=", 1))
		Expect(filepath.Join(env.AreasRoot, "ctr-orphan", "workspace")).To(BeADirectory())
	})

	It("reports a missing image as ImageNotFound, naming the image and the namespace", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "imageless", "ctr-imageless", time.Minute)
		sb.Spec.Containerd.Image = "localhost/sandbox-controller/absent:1"
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "wants", "imageless"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "imageless"), timeout).Should(sandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonImageNotFound))
		st, err := env.SandboxStatus(ns, "imageless")()
		Expect(err).NotTo(HaveOccurred())
		msg := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady).Message
		Expect(msg).To(And(ContainSubstring(`"localhost/sandbox-controller/absent:1"`), ContainSubstring(`namespace "`+e2eNamespace+`"`)))
		Expect(inspect(drv, v1alpha1.InstanceName("ctr-imageless")).Exists).To(BeFalse())
	})

	It("stops a write at rootfsSizeLimit, and turns OverlayHealthy False when a smaller limit is below what the layer holds and True when it shrinks", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "bounded", "ctr-bounded", time.Minute)
		sb.Spec.Containerd.RootfsSizeLimit = ptr.To(resource.MustParse("1Mi"))
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-bounded")
		Expect(k8s.Create(ctx, newClaim(ns, "held", "bounded"))).To(Succeed())
		overlay := func(status metav1.ConditionStatus, reason string) OmegaMatcher {
			return HaveField("Conditions", haveCondition(v1alpha1.ConditionOverlayHealthy, status, reason))
		}
		Eventually(env.SandboxStatus(ns, "bounded"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning), overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy)))

		code, out := inContainer(drv, inst, "sh", "-c", "head -c 2097152 /dev/zero > /var/tmp/big")
		Expect(code).NotTo(Equal(0), "2 MiB written into a 1Mi rootfs: "+out)
		code, out = inContainer(drv, inst, "sh", "-c", "rm /var/tmp/big && head -c 614400 /dev/zero > /var/tmp/big")
		Expect(code).To(Equal(0), out)
		Eventually(env.SandboxStatus(ns, "bounded"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))

		By("a limit made smaller than what the layer holds is reported")
		// The controller writes status meanwhile: retry on a conflict.
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
				return err
			}
			sb.Spec.Containerd.RootfsSizeLimit = ptr.To(resource.MustParse("512Ki"))
			return k8s.Update(ctx, sb)
		}, timeout).Should(Succeed())
		Eventually(env.SandboxStatus(ns, "bounded"), timeout).Should(overlay(metav1.ConditionFalse, v1alpha1.ReasonUpperDirOverLimit))

		code, out = inContainer(drv, inst, "sh", "-c", "rm /var/tmp/big")
		Expect(code).To(Equal(0), out)
		Eventually(env.SandboxStatus(ns, "bounded"), timeout).Should(overlay(metav1.ConditionTrue, v1alpha1.ReasonHealthy))
	})

	It("holds a mount change until the claims are gone, then restarts with it and keeps the root", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "changing", "ctr-changing", time.Second)
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-changing")
		Expect(k8s.Create(ctx, newClaim(ns, "held", "changing"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "changing"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		code, out := inContainer(drv, inst, "sh", "-c", "echo kept > /var/tmp/state")
		Expect(code).To(Equal(0), out)

		docs := filepath.Join(env.Dir, "docs-for-changing")
		Expect(os.MkdirAll(docs, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(docs, "readme"), []byte("docs\n"), 0o644)).To(Succeed())
		// The controller writes status meanwhile: retry on a conflict.
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
				return err
			}
			sb.Spec.Mounts = []v1alpha1.Mount{{Source: docs, Target: "docs", Mode: v1alpha1.MountReadOnly}}
			return k8s.Update(ctx, sb)
		}, timeout).Should(Succeed())
		Eventually(env.SandboxStatus(ns, "changing"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionFalse, v1alpha1.ReasonRestartRequired))))

		env.DeleteAndWait(newClaim(ns, "held", "changing"))
		Eventually(env.SandboxStatus(ns, "changing"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(k8s.Create(ctx, newClaim(ns, "again", "changing"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "changing"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionTrue, v1alpha1.ReasonRunning))))
		_, out = inContainer(drv, inst, "cat", "/workspace/docs/readme", "/var/tmp/state")
		Expect(out).To(Equal("docs\nkept\n"))
	})
})

var _ = Describe("controller restart", func() {
	It("adopts the running container instead of making or restarting it", func() {
		ns := env.NewNamespace()
		Expect(k8s.Create(ctx, newSandbox(ns, "survivor", "ctr-survivor", time.Minute))).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-survivor")
		Expect(k8s.Create(ctx, newClaim(ns, "held", "survivor"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "survivor"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		before := inspect(drv, inst)

		mgr.Stop()
		mgr = startManager()

		Eventually(func() int { return recorder().Count("Inspect", inst) }, timeout).Should(BeNumerically(">=", 1))
		Consistently(func() int { return recorder().Count("Ensure", inst) }, 2*time.Second).Should(Equal(0))
		after := inspect(drv, inst)
		Expect(after.Running).To(BeTrue())
		Expect(after.CreatedAt).To(Equal(before.CreatedAt))
		Expect(env.SandboxStatus(ns, "survivor")()).To(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		code, out := inContainer(drv, inst, "true")
		Expect(code).To(Equal(0), out)
	})
})

var _ = testharness.DescribeWorktrees("containerd", testharness.WorktreeSuite{
	Env: func() *testharness.Env { return env },
	NewSandbox: func(ns, name, agent string) *v1alpha1.Sandbox {
		return newSandbox(ns, name, agent, time.Minute)
	},
	Runtime: func() runtimes.Runtime { return drv },
})
