//go:build e2e

package incus_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

var (
	newClaim      = testharness.NewClaim
	haveCondition = testharness.HaveCondition
	sandboxIs     = testharness.SandboxIs
)

var _ = Describe("Incus lifecycle", func() {
	It("creates and starts on the first claim, runs commands as the agent's own host identity in /workspace, reuses the instance for a second claim, and stops without deleting it", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "life")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		name := instanceOf(sb)

		By("no claim: nothing is created")
		Eventually(sandboxStatus(ns, "life"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(inspect(name).Exists).To(BeFalse())

		By("first claim: the instance is created and started, with a healthy root volume")
		Expect(k8s.Create(ctx, newClaim(ns, "c1", "life"))).To(Succeed())
		Eventually(sandboxStatus(ns, "life"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionOverlayHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy)),
		))
		st := inspect(name)
		Expect(st).To(And(HaveField("Exists", true), HaveField("Running", true), HaveField("Owner", ns+"/life")))
		created := st.CreatedAt

		By("a command runs as the agent's own unprivileged host id, mapped to itself, and writes to /workspace")
		id := agentID(sb)
		Expect(id.UID).NotTo(Equal(uint32(os.Getuid())), "the controller's own uid is never the agent's")
		code, out := run(name, `id -u; id -g; pwd; echo "$HOME"; echo hello > note`)
		Expect(code).To(Equal(0), out)
		Expect(strings.Fields(out)).To(Equal([]string{
			strconv.Itoa(int(id.UID)), strconv.Itoa(int(id.GID)), "/workspace", "/workspace",
		}))
		inst, _, err := rawClient().InProject("").GetInstance(ctx, name)
		Expect(err).NotTo(HaveOccurred())
		Expect(inst.Config["raw.idmap"]).To(Equal(fmt.Sprintf("both %d %d", id.UID, id.UID)), "only the agent's id is mapped, never the controller's")

		By("the file belongs to the agent's identity on the host")
		fi, err := os.Stat(filepath.Join(areaPath(sb, "workspace"), "note"))
		Expect(err).NotTo(HaveOccurred())
		sys := fi.Sys().(*syscall.Stat_t)
		Expect(sys.Uid).To(Equal(id.UID))
		Expect(sys.Gid).To(Equal(id.GID))

		By("a command outside the allowlist is refused and nothing runs")
		_, err = rt().Exec(ctx, name, runtimes.ExecRequest{Argv: []string{"rm", "note"}})
		Expect(runtimes.ReasonOf(err)).To(Equal(runtimes.ReasonRefused))
		Expect(filepath.Join(areaPath(sb, "workspace"), "note")).To(BeAnExistingFile())

		By("a second claim reuses the running instance")
		Expect(k8s.Create(ctx, newClaim(ns, "c2", "life"))).To(Succeed())
		Eventually(sandboxStatus(ns, "life"), timeout).Should(sandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Expect(rt().Count("Ensure", name)).To(Equal(1))

		By("zero claims: stopped after idleTimeout, not deleted")
		env.DeleteAndWait(&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1"}})
		env.DeleteAndWait(&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c2"}})
		Eventually(sandboxStatus(ns, "life"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		st = inspect(name)
		Expect(st).To(And(HaveField("Exists", true), HaveField("Running", false)))
		Expect(st.CreatedAt).To(BeTemporally("==", created))

		By("deleting the Sandbox deletes the instance; the areas stay")
		env.DeleteAndWait(sb)
		Expect(inspect(name).Exists).To(BeFalse())
		Expect(filepath.Join(areaPath(sb, "workspace"), "note")).To(BeAnExistingFile())
	})

	It("keeps container-local state across stop and start", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "state")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		name := instanceOf(sb)
		Expect(k8s.Create(ctx, newClaim(ns, "c", "state"))).To(Succeed())
		Eventually(sandboxStatus(ns, "state"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		By("state written in the container's own root, outside every area")
		id := agentID(sb)
		cl := rawClient().InProject("")
		Expect(cl.MakeDir(ctx, name, "/srv", 0, 0, 0o755)).To(Succeed())
		Expect(cl.MakeDir(ctx, name, "/srv/agent", int(id.UID), int(id.GID), 0o755)).To(Succeed())
		code, out := run(name, "echo installed > /srv/agent/package")
		Expect(code).To(Equal(0), out)

		By("stop (last claim released) and start (a new claim)")
		env.DeleteAndWait(&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"}})
		Eventually(sandboxStatus(ns, "state"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(inspect(name).Running).To(BeFalse())
		Expect(k8s.Create(ctx, newClaim(ns, "again", "state"))).To(Succeed())
		Eventually(sandboxStatus(ns, "state"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		code, out = run(name, "cat /srv/agent/package")
		Expect(code).To(Equal(0), out)
		Expect(out).To(Equal("installed\n"))
		env.DeleteAndWait(sb)
	})

	It("mounts the areas and custom mounts, read-only where the spec says", func() {
		ns := env.NewNamespace()
		ro, rw := filepath.Join(env.Dir, ns+"-ro"), filepath.Join(env.Dir, ns+"-rw")
		Expect(os.MkdirAll(ro, 0o755)).To(Succeed())
		Expect(os.MkdirAll(rw, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(ro, "readme"), []byte("from the host\n"), 0o644)).To(Succeed())
		sb := newSandbox(ns, "mounts")
		sb.Spec.Mounts = []v1alpha1.Mount{
			{Source: ro, Target: "docs", Mode: v1alpha1.MountReadOnly},
			{Source: rw, Target: "out", Mode: v1alpha1.MountReadWrite},
		}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "mounts"))).To(Succeed())
		Eventually(sandboxStatus(ns, "mounts"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)
		// The read-write mount is the agent's, as an administrator hands it
		// a project; the read-only one stays root's, readable by anyone.
		giveTo(sb, rw)

		code, out := run(name, "cat /workspace/docs/readme")
		Expect(code).To(Equal(0), out)
		Expect(out).To(Equal("from the host\n"))
		for _, target := range []string{"/workspace/docs/x", "/blocks/x"} {
			code, out = run(name, "touch "+target)
			Expect(code).NotTo(Equal(0), "writing %s should fail: %s", target, out)
			Expect(out).To(ContainSubstring("Read-only file system"))
		}
		Expect(filepath.Join(ro, "x")).NotTo(BeAnExistingFile())
		for _, target := range []string{"/workspace/out/x", "/memories/x", "/skills/x", "/tasks/x"} {
			code, out = run(name, "touch "+target)
			Expect(code).To(Equal(0), "writing %s: %s", target, out)
		}
		Expect(filepath.Join(rw, "x")).To(BeAnExistingFile())
		env.DeleteAndWait(sb)
	})

	It("applies a mount change live, without recreating or restarting the instance", func() {
		ns := env.NewNamespace()
		extra := filepath.Join(env.Dir, ns+"-extra")
		Expect(os.MkdirAll(extra, 0o755)).To(Succeed())
		sb := newSandbox(ns, "live")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "live"))).To(Succeed())
		Eventually(sandboxStatus(ns, "live"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)
		giveTo(sb, extra)
		created := inspect(name).CreatedAt
		code, out := run(name, "cat /proc/1/stat")
		Expect(code).To(Equal(0), out)
		initStart := strings.Fields(out)[21]

		setMounts := func(mounts ...v1alpha1.Mount) {
			Eventually(func() error {
				var cur v1alpha1.Sandbox
				if err := k8s.Get(ctx, client.ObjectKeyFromObject(sb), &cur); err != nil {
					return err
				}
				cur.Spec.Mounts = mounts
				return k8s.Update(ctx, &cur)
			}, timeout).Should(Succeed())
		}

		By("adding a read-write mount")
		setMounts(v1alpha1.Mount{Source: extra, Target: "extra", Mode: v1alpha1.MountReadWrite})
		Eventually(func() int { c, _ := run(name, "echo added > /workspace/extra/f"); return c }, timeout).Should(Equal(0))
		Expect(filepath.Join(extra, "f")).To(BeAnExistingFile())

		By("making it read-only")
		setMounts(v1alpha1.Mount{Source: extra, Target: "extra", Mode: v1alpha1.MountReadOnly})
		Eventually(func() string { _, o := run(name, "touch /workspace/extra/g"); return o }, timeout).Should(ContainSubstring("Read-only file system"))

		By("removing it")
		setMounts()
		Eventually(func() int { c, _ := run(name, "cat /workspace/extra/f"); return c }, timeout).ShouldNot(Equal(0))

		By("the instance was neither recreated nor restarted")
		Expect(inspect(name).CreatedAt).To(BeTemporally("==", created))
		code, out = run(name, "cat /proc/1/stat")
		Expect(code).To(Equal(0), out)
		Expect(strings.Fields(out)[21]).To(Equal(initStart), "the container's init was restarted")
		Expect(rt().Count("Stop", name)).To(Equal(0))
		Eventually(sandboxStatus(ns, "live"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionTrue, v1alpha1.ReasonRunning)))
		env.DeleteAndWait(sb)
	})

	It("reports an image change as RestartRequired and applies it when idle by rebuilding the root", func() {
		ns := env.NewNamespace()
		renamed := image + "-renamed"
		if _, err := rawClient().GetImageAlias(ctx, renamed); err != nil {
			Fail("the second test image alias " + renamed + " is missing: " + setupHint)
		}
		sb := newSandbox(ns, "image")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "image"))).To(Succeed())
		Eventually(sandboxStatus(ns, "image"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)
		created := inspect(name).CreatedAt
		Expect(rawClient().WriteFile(ctx, name, "/etc/local-state", []byte("old root\n"), 0, 0, 0o644)).To(Succeed())

		By("changing the image of the running instance: it keeps serving, RestartRequired names the change")
		Eventually(func() error {
			var cur v1alpha1.Sandbox
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sb), &cur); err != nil {
				return err
			}
			cur.Spec.Incus.Image = renamed
			return k8s.Update(ctx, &cur)
		}, timeout).Should(Succeed())
		Eventually(sandboxStatus(ns, "image"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionFalse, v1alpha1.ReasonRestartRequired),
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			ContainElement(HaveField("Message", ContainSubstring(renamed))),
		)))
		code, out := run(name, "cat /etc/local-state")
		Expect(code).To(Equal(0), out)

		By("idle: stopped, then rebuilt from the new image at the next start")
		env.DeleteAndWait(&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"}})
		Eventually(sandboxStatus(ns, "image"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(k8s.Create(ctx, newClaim(ns, "again", "image"))).To(Succeed())
		Eventually(sandboxStatus(ns, "image"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionTrue, v1alpha1.ReasonRunning)),
		))
		Expect(inspect(name).CreatedAt).To(BeTemporally("==", created), "rebuilt in place, not recreated")
		code, out = run(name, "cat /etc/local-state")
		Expect(code).NotTo(Equal(0), "the old root's state should be gone after the rebuild: %s", out)
		code, out = run(name, "cat /etc/passwd")
		Expect(code).To(Equal(0), out)
		id := agentID(sb)
		Expect(out).To(ContainSubstring(fmt.Sprintf(":%d:%d:", id.UID, id.GID)), "the mapped account is set up again in the new root")
		env.DeleteAndWait(sb)
	})

	It("kills a command whose context ends", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "cancel")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "cancel"))).To(Succeed())
		Eventually(sandboxStatus(ns, "cancel"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)

		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start := time.Now()
		_, err := rt().Exec(cctx, name, runtimes.ExecRequest{Argv: []string{"sleep", "300"}})
		Expect(err).To(MatchError(context.DeadlineExceeded))
		Expect(time.Since(start)).To(BeNumerically("<", 15*time.Second))
		Eventually(func() string { _, o := run(name, "ps -o args"); return o }, timeout).ShouldNot(ContainSubstring("sleep 300"))
		env.DeleteAndWait(sb)
	})
})

var _ = Describe("Incus failures", func() {
	It("reports a bad image as Ready=False with reason ImageNotFound naming the image", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "badimg")
		sb.Spec.Incus.Image = "no-such-image-" + ns
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "badimg"))).To(Succeed())
		Eventually(sandboxStatus(ns, "badimg"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonImageNotFound),
			ContainElement(HaveField("Message", ContainSubstring(sb.Spec.Incus.Image))),
		)))
		Expect(inspect(instanceOf(sb)).Exists).To(BeFalse())
		env.DeleteAndWait(sb)
		// The sources held for an instance never made go with its Sandbox.
		Eventually(func() bool {
			_, err := os.Stat(filepath.Join(incus.DefaultHeldDir, instanceOf(sb)))
			return os.IsNotExist(err)
		}, timeout).Should(BeTrue(), "held sources of %s are left below %s", instanceOf(sb), incus.DefaultHeldDir)
	})

	It("says what a restricted project must permit: raw.idmap for the agent's ids, then the hardening, then host-path disks", func() {
		ns := env.NewNamespace()
		project := "sbx-" + ns
		createRestrictedProject(project)
		DeferCleanup(deleteProject, project)

		sb := newSandbox(ns, "restricted")
		sb.Spec.Incus.Project = project
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "restricted"))).To(Succeed())
		id := agentID(sb)
		Eventually(sandboxStatus(ns, "restricted"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonIdmapNotPermitted),
			ContainElement(HaveField("Message", ContainSubstring(fmt.Sprintf("restricted.idmap.uid=%d restricted.idmap.gid=%d", id.UID, id.GID)))),
		)))

		By("permitting the ids: the next thing the project must permit is named")
		patchProject(project, map[string]string{
			"restricted.idmap.uid": strconv.Itoa(int(id.UID)),
			"restricted.idmap.gid": strconv.Itoa(int(id.GID)),
		})
		nudge(sb)
		Eventually(sandboxStatus(ns, "restricted"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonHardeningNotPermitted),
			ContainElement(HaveField("Message", ContainSubstring("restricted.containers.lowlevel=allow"))),
		)))

		By("permitting the hardening: the next thing the project must permit is named")
		patchProject(project, map[string]string{"restricted.containers.lowlevel": "allow"})
		nudge(sb)
		Eventually(sandboxStatus(ns, "restricted"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonHostDisksNotPermitted),
			ContainElement(HaveField("Message", ContainSubstring("restricted.devices.disk=allow"))),
		)))

		By("permitting host-path disks below the driver's held sources: Ready")
		patchProject(project, map[string]string{
			"restricted.devices.disk":       "allow",
			"restricted.devices.disk.paths": incus.DefaultHeldDir,
		})
		nudge(sb)
		Eventually(sandboxStatus(ns, "restricted"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		code, out := run(instanceOf(sb), "id -u")
		Expect(code).To(Equal(0), out)
		env.DeleteAndWait(sb)
	})

	It("comes back to Ready after incusd is killed and restarted, without a second instance", func() {
		if !startedByScript() {
			testenv.Missing(GinkgoT(), "an incusd started by hack/incus.sh (this spec kills and restarts it and will not do that to another one)", "run hack/incus.sh start, as make test does")
		}
		ns := env.NewNamespace()
		sb := newSandbox(ns, "crash")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "crash"))).To(Succeed())
		Eventually(sandboxStatus(ns, "crash"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)
		created := inspect(name).CreatedAt

		By("killing incusd: RuntimeUnavailable naming the socket")
		incusScript("crash")
		DeferCleanup(incusScript, "start")
		Eventually(sandboxStatus(ns, "crash"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRuntimeUnavailable),
			ContainElement(HaveField("Message", ContainSubstring(driver.Client().Socket()))),
		)))

		By("restarting it: Ready again, the same instance")
		incusScript("start")
		Eventually(sandboxStatus(ns, "crash"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		states, err := driver.List(ctx)
		Expect(err).NotTo(HaveOccurred())
		var same []runtimes.State
		for _, st := range states {
			if st.Name == name {
				same = append(same, st)
			}
		}
		Expect(same).To(HaveLen(1))
		Expect(same[0].CreatedAt).To(BeTemporally("==", created))
		code, out := run(name, "true")
		Expect(code).To(Equal(0), out)
		env.DeleteAndWait(sb)
	})
})

var _ = Describe("Incus shutdownOnExit", Ordered, func() {
	It("stops instances with shutdownOnExit true when the controller exits, keeps the others running, and a restarted controller reuses them", func() {
		ns := env.NewNamespace()
		stopping := newSandbox(ns, "stops")
		keeping := newSandbox(ns, "keeps")
		keeping.Spec.Incus.ShutdownOnExit = ptr.To(false)
		for _, sb := range []*v1alpha1.Sandbox{stopping, keeping} {
			Expect(k8s.Create(ctx, sb)).To(Succeed())
			Expect(k8s.Create(ctx, newClaim(ns, "c-"+sb.Name, sb.Name))).To(Succeed())
			Eventually(sandboxStatus(ns, sb.Name), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		}
		code, out := run(instanceOf(keeping), "cat /proc/1/stat")
		Expect(code).To(Equal(0), out)
		initStart := strings.Fields(out)[21]

		By("the controller exits")
		mgr.Stop()
		Expect(inspect(instanceOf(stopping)).Running).To(BeFalse(), "shutdownOnExit true: stopped on exit")
		Expect(inspect(instanceOf(keeping)).Running).To(BeTrue(), "shutdownOnExit false: left running")

		By("a new controller starts the stopped one and adopts the running one")
		mgr = startManager()
		for _, sb := range []*v1alpha1.Sandbox{stopping, keeping} {
			Eventually(sandboxStatus(ns, sb.Name), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		}
		Eventually(func() bool { return inspect(instanceOf(stopping)).Running }, timeout).Should(BeTrue())
		Consistently(func() int {
			return rt().Count("Ensure", instanceOf(keeping)) + rt().Count("Stop", instanceOf(keeping))
		}, 2*time.Second).Should(Equal(0), "the running instance must be reused, not ensured or stopped")
		code, out = run(instanceOf(keeping), "cat /proc/1/stat")
		Expect(code).To(Equal(0), out)
		Expect(strings.Fields(out)[21]).To(Equal(initStart), "the kept instance was restarted")
		env.DeleteAndWait(stopping)
		env.DeleteAndWait(keeping)
	})
})

// nudge makes the controller reconcile a Sandbox now: a change in the
// Incus project is not an event it can watch.
func nudge(sb *v1alpha1.Sandbox) {
	Eventually(func() error {
		var cur v1alpha1.Sandbox
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(sb), &cur); err != nil {
			return err
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations["test.sandbox.cireilclaw.dev/nudge"] = time.Now().Format(time.RFC3339Nano)
		return k8s.Update(ctx, &cur)
	}, timeout).Should(Succeed())
}

// createRestrictedProject makes a restricted project with its own default
// profile holding a root disk, as an administrator would.
func createRestrictedProject(project string) {
	cl := rawClient()
	_, err := cl.Run(ctx, http.MethodPost, "/1.0/projects", nil, map[string]any{
		"name":   project,
		"config": map[string]string{"restricted": "true", "features.profiles": "true", "features.images": "false"},
	}, "")
	Expect(err).NotTo(HaveOccurred())
	_, err = cl.InProject(project).Run(ctx, http.MethodPut, "/1.0/profiles/default", nil, map[string]any{
		"config":  map[string]string{},
		"devices": map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default"}},
	}, "")
	Expect(err).NotTo(HaveOccurred())
}

// patchProject sets config keys of a project. The daemon's PATCH replaces
// the whole config map, so the keys are merged here and PUT.
func patchProject(project string, config map[string]string) {
	var cur struct {
		Config      map[string]string `json:"config"`
		Description string            `json:"description"`
	}
	res, err := rawClient().Get(ctx, "/1.0/projects/"+project, nil, &cur)
	Expect(err).NotTo(HaveOccurred())
	for k, v := range config {
		cur.Config[k] = v
	}
	_, err = rawClient().Run(ctx, http.MethodPut, "/1.0/projects/"+project, nil, cur, res.ETag)
	Expect(err).NotTo(HaveOccurred())
}

// deleteProject deletes the instances left in a project, then the project
// (its own default profile goes with it).
func deleteProject(project string) {
	list, err := rawClient().InProject(project).ListInstances(ctx, false)
	Expect(err).NotTo(HaveOccurred())
	for _, in := range list {
		Expect(driver.Delete(ctx, in.Name)).To(Succeed())
	}
	_, err = rawClient().Run(ctx, http.MethodDelete, "/1.0/projects/"+project, nil, nil, "")
	Expect(err).NotTo(HaveOccurred())
}

var _ = testharness.DescribeWorktrees("incus", testharness.WorktreeSuite{
	Env: func() *testharness.Env { return env },
	NewSandbox: func(ns, name, agent string) *v1alpha1.Sandbox {
		sb := newSandbox(ns, name)
		sb.Spec.Agent = agent
		return sb
	},
	Runtime: func() runtimes.Runtime { return driver },
})

var _ = Describe("Incus overlay mounts", func() {
	It("binds the merged view, keeps the source, reports the size limit, unmounts on stop and keeps the changes on delete", func() {
		ns := env.NewNamespace()
		src := runtimetest.OverlaySource(GinkgoT())
		sb := newSandbox(ns, "ovl")
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay, SizeLimit: ptr.To(resource.MustParse("100Ki"))}}
		in, err := testharness.DescribeAs(sb, instance.Host{AreasRoot: env.AreasRoot})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = driver.Delete(ctx, in.Name) })
		// The driver alone: a running controller would collect an
		// instance whose Sandbox it cannot find.
		mgr.Stop()
		DeferCleanup(func() { mgr = startManager() })
		runtimetest.OverlayMount(GinkgoT(), driver, in, src)
	})
})

var _ = Describe("Incus git directory binds", func() {
	It("binds a git directory live from a handle, and never a link out of its mount", func() {
		ns := env.NewNamespace()
		projects := filepath.Join(env.Dir, ns, "projects")
		gitDir := filepath.Join(projects, "app", ".git")
		secret := filepath.Join(env.Dir, ns, "host-secret")
		Expect(os.MkdirAll(gitDir, 0o755)).To(Succeed())
		Expect(os.MkdirAll(secret, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(gitDir, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(secret, "HEAD"), []byte("host secret\n"), 0o644)).To(Succeed())
		sb := newSandbox(ns, "gd")
		sb.Spec.Mounts = []v1alpha1.Mount{{Source: projects, Target: "project", Mode: v1alpha1.MountReadWrite}}
		in, err := testharness.DescribeAs(sb, instance.Host{AreasRoot: env.AreasRoot})
		Expect(err).NotTo(HaveOccurred())
		withGit := in
		withGit.Mounts = slices.Clone(in.Mounts)
		withGit.AddBinds(runtimes.Bind{Source: gitDir, Target: gitDir})
		DeferCleanup(func() { _ = driver.Delete(ctx, in.Name) })
		// The driver alone: a running controller would collect an
		// instance whose Sandbox it cannot find.
		mgr.Stop()
		DeferCleanup(func() { mgr = startManager() })

		_, err = driver.Ensure(ctx, in)
		Expect(err).NotTo(HaveOccurred())
		code, out := run(in.Name, "cat "+gitDir+"/HEAD")
		Expect(code).NotTo(Equal(0), "no git directory before a claim needs it: %s", out)

		By("added to the running instance")
		_, err = driver.Ensure(ctx, withGit)
		Expect(err).NotTo(HaveOccurred())
		code, out = run(in.Name, "cat "+gitDir+"/HEAD")
		Expect(code).To(Equal(0), out)
		Expect(out).To(Equal("ref: refs/heads/main\n"))
		Expect(inspect(in.Name).ConfigHash).To(Equal(withGit.ConfigHash))

		By("a restart behind the driver's back loses the bind: Inspect says so, Ensure binds it again")
		Expect(driver.Client().SetState(ctx, in.Name, incusapi.InstanceStatePut{Action: "restart", Timeout: 10})).To(Succeed())
		Eventually(func() bool { return inspect(in.Name).Running }, timeout).Should(BeTrue())
		Expect(inspect(in.Name).ConfigHash).To(BeEmpty(), "a running instance without its git directory is not as recorded")
		_, err = driver.Ensure(ctx, withGit)
		Expect(err).NotTo(HaveOccurred())
		code, out = run(in.Name, "cat "+gitDir+"/HEAD")
		Expect(code).To(Equal(0), out)
		Expect(inspect(in.Name).ConfigHash).To(Equal(withGit.ConfigHash))

		By("a .git replaced by a link out of the mount is not bound at the next start")
		Expect(driver.Stop(ctx, in.Name)).To(Succeed())
		Expect(os.RemoveAll(gitDir)).To(Succeed())
		Expect(os.Symlink(secret, gitDir)).To(Succeed())
		_, err = driver.Ensure(ctx, withGit)
		Expect(err).NotTo(HaveOccurred())
		code, out = run(in.Name, "cat "+gitDir+"/HEAD")
		Expect(code).NotTo(Equal(0), "a link out of the mount was bound: %s", out)
		Expect(out).NotTo(ContainSubstring("host secret"))
	})
})

var _ = Describe("Incus resource limits, through the driver", func() {
	It("stops a fork bomb at the pids limit and kills a memory hog at the memory limit, counting both", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "limits")
		sb.Spec.Binaries = []v1alpha1.BinaryName{"sh", "sleep"}
		sb.Spec.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](runtimetest.LimitedPids),
			Limits: v1alpha1.ResourceAmounts{Memory: resource.NewQuantity(runtimetest.LimitedMemory, resource.BinarySI)}}
		in, err := testharness.DescribeAs(sb, instance.Host{AreasRoot: env.AreasRoot})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = driver.Delete(ctx, in.Name) })
		mgr.Stop()
		DeferCleanup(func() { mgr = startManager() })
		runtimetest.Limits(GinkgoT(), driver, in)
	})
})

var _ = Describe("Incus TCP buffers", func() {
	It("bounds what an instance whose loopback is up queues on TCP by its memory limit, and counts it", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "tcp")
		sb.Spec.Binaries = []v1alpha1.BinaryName{"sh"}
		sb.Spec.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](512),
			Limits: v1alpha1.ResourceAmounts{Memory: resource.NewQuantity(runtimetest.TCPMemory, resource.BinarySI)}}
		in, err := testharness.DescribeAs(sb, instance.Host{AreasRoot: env.AreasRoot})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = driver.Delete(ctx, in.Name) })
		mgr.Stop()
		DeferCleanup(func() { mgr = startManager() })
		_, err = driver.Ensure(ctx, in)
		Expect(err).NotTo(HaveOccurred())

		By("serving an egress proxy in its network namespace, which brings its loopback up")
		st, err := rawClient().GetInstanceState(ctx, in.Name)
		Expect(err).NotTo(HaveOccurred())
		netns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", st.Pid))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(netns.Close)
		nets := &egress.Networks{Dir: GinkgoT().TempDir()}
		Expect(nets.ServeIn(in.Name, ns, netns, egress.Policy{})).To(Succeed())
		DeferCleanup(func() { _ = nets.Release(in.Name) })

		runtimetest.TCPBuffers(GinkgoT(), driver, in)
	})
})

var _ = Describe("Incus rootSizeLimit", func() {
	// As root inside the instance: the root volume is root's to fill.
	fill := func(name string, bytes int) (int, string) {
		var out strings.Builder
		code, err := rawClient().Exec(ctx, name, incusapi.ExecRequest{
			Command: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero > /big; echo rc=$?; ls -l /big; rm -f /big", bytes)},
			Env:     map[string]string{"PATH": "/bin:/sbin:/usr/bin"}, Cwd: "/", Stdout: &out, Stderr: &out})
		Expect(err).NotTo(HaveOccurred(), out.String())
		return code, out.String()
	}

	It("holds the root volume to its size on a pool with quotas", func() {
		// hack/incus.sh start makes it (INCUS_QUOTA_PROFILE, default quota).
		profile := os.Getenv("INCUS_QUOTA_PROFILE")
		if profile == "" {
			profile = "quota"
		}
		if _, err := rawClient().InProject("").Get(ctx, "/1.0/profiles/"+profile, nil, nil); err != nil {
			testenv.Missing(GinkgoT(), "profile "+profile+" with its root disk on a pool with quotas ("+err.Error()+")", "hack/incus.sh start")
		}
		ns := env.NewNamespace()
		sb := newSandbox(ns, "rootsize")
		sb.Spec.Incus.Profiles = []string{profile}
		sb.Spec.Incus.RootSizeLimit = ptr.To(resource.MustParse("64Mi"))
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "rootsize"))).To(Succeed())
		Eventually(sandboxStatus(ns, "rootsize"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionOverlayHealthy, metav1.ConditionTrue, v1alpha1.ReasonHealthy))))
		_, out := fill(instanceOf(sb), 200<<20)
		Expect(out).NotTo(ContainSubstring("rc=0"), "200 MiB written into a root with a 64Mi rootSizeLimit")
		env.DeleteAndWait(sb)
	})

	It("says so when the pool cannot hold the root to its size", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "nosize")
		sb.Spec.Incus.RootSizeLimit = ptr.To(resource.MustParse("64Mi"))
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "nosize"))).To(Succeed())
		Eventually(sandboxStatus(ns, "nosize"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionOverlayHealthy, metav1.ConditionFalse, v1alpha1.ReasonSizeLimitNotEnforced))))
		inst, _, err := rawClient().InProject("").GetInstance(ctx, instanceOf(sb))
		Expect(err).NotTo(HaveOccurred())
		Expect(inst.Devices["root"]).To(HaveKeyWithValue("size", "67108864"), "the size is asked of the pool all the same")
		env.DeleteAndWait(sb)
	})
})
