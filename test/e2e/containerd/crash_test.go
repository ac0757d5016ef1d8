//go:build e2e

package containerd_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// The crash spec kills a containerd of its own, started by the same script
// under another prefix, so the daemon other tests share is never touched.
// Its Sandboxes name a node of their own, so only the manager made for the
// spec reconciles them.
var _ = Describe("containerd killed and restarted", Ordered, func() {
	const node = "crash-node"
	var (
		daemonEnv []string
		private   *containerd.Runtime
		m         *testharness.Manager
	)

	BeforeAll(func() {
		prefix := filepath.Join(env.Dir, "crashd")
		daemonEnv = []string{
			"CONTAINERD_PREFIX=" + prefix,
			"CONTAINERD_NAMESPACE=" + e2eNamespace,
			fmt.Sprintf("CONTAINERD_SHIM_DIR=/run/sandbox-controller/e2e-%d", os.Getpid()),
		}
		containerdScript(daemonEnv, "start")
		DeferCleanup(func() { containerdScript(daemonEnv, "stop") })
		private = newDriver(filepath.Join(prefix, "run", "containerd.sock"))
		DeferCleanup(private.Close)
		// The spec's containers go, with their mount trees, before the
		// daemon stops: stopping it kills the tasks but leaves the trees
		// mounted on the host. A spec that failed while the daemon was
		// down brings it back first (start is a no-op when it runs).
		DeferCleanup(func() {
			containerdScript(daemonEnv, "start")
			states, err := private.List(ctx)
			Expect(err).NotTo(HaveOccurred())
			for _, st := range states {
				Expect(private.Delete(ctx, st.Name)).To(Succeed())
			}
		})
		m = env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendContainerd: private},
			controllers.Options{NodeName: node, HealthInterval: healthInterval, OrphanInterval: orphanInterval})
		DeferCleanup(m.Stop)
	})

	It("reports RuntimeUnavailable while the daemon is down and is Ready again with the same container", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "crashed", "ctr-crashed", time.Minute)
		sb.Spec.NodeName = node
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		inst := v1alpha1.InstanceName("ctr-crashed")
		Expect(k8s.Create(ctx, newClaim(ns, "held", "crashed"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "crashed"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		before := inspect(private, inst)
		rec := m.Runtimes[v1alpha1.BackendContainerd]
		Expect(rec.Count("Ensure", inst)).To(Equal(1))

		containerdScript(daemonEnv, "crash")
		Eventually(env.SandboxStatus(ns, "crashed"), timeout).Should(sandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonRuntimeUnavailable))

		containerdScript(daemonEnv, "start")
		Eventually(env.SandboxStatus(ns, "crashed"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		after := inspect(private, inst)
		Expect(after.Running).To(BeTrue())
		Expect(after.CreatedAt).To(Equal(before.CreatedAt), "the container outlived the daemon; it must not be made again")
		Expect(rec.Count("Ensure", inst)).To(Equal(1), "the running task outlived the daemon; nothing to ensure")
		states, err := private.List(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(states).To(HaveLen(1))
		code, out := inContainer(private, inst, "true")
		Expect(code).To(Equal(0), out)
	})
})
