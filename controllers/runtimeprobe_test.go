package controllers_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

// flakyRuntime is a real driver whose every call fails with
// RuntimeUnavailable while down, as a driver does while its daemon is gone.
type flakyRuntime struct {
	runtimes.Runtime
	down atomic.Bool
	// inspects counts the failed Inspects: every Sandbox reconcile's first
	// runtime call, so one a reconcile.
	inspects atomic.Int32
}

func (f *flakyRuntime) unavailable(op, name string) error {
	return runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "the daemon is down (test)")
}

func (f *flakyRuntime) Ensure(ctx context.Context, in runtimes.Instance) (runtimes.State, error) {
	if f.down.Load() {
		return runtimes.State{}, f.unavailable("ensuring", in.Name)
	}
	return f.Runtime.Ensure(ctx, in)
}

func (f *flakyRuntime) Inspect(ctx context.Context, name string) (runtimes.State, error) {
	if f.down.Load() {
		f.inspects.Add(1)
		return runtimes.State{}, f.unavailable("inspecting", name)
	}
	return f.Runtime.Inspect(ctx, name)
}

func (f *flakyRuntime) Stop(ctx context.Context, name string) error {
	if f.down.Load() {
		return f.unavailable("stopping", name)
	}
	return f.Runtime.Stop(ctx, name)
}

func (f *flakyRuntime) Delete(ctx context.Context, name string) error {
	if f.down.Load() {
		return f.unavailable("deleting", name)
	}
	return f.Runtime.Delete(ctx, name)
}

func (f *flakyRuntime) List(ctx context.Context) ([]runtimes.State, error) {
	if f.down.Load() {
		return nil, f.unavailable("listing", "")
	}
	return f.Runtime.List(ctx)
}

var _ = Describe("Catch-up after a runtime outage", func() {
	It("makes a Sandbox Ready within a few seconds of its runtime coming back, however long the outage", func() {
		// A second manager with its own node name, so the suite's manager
		// leaves these Sandboxes to it.
		const node = "flaky-node"
		state := filepath.Join(env.Dir, "state-flaky")
		drv, err := bwrap.New(bwrap.Config{StateDir: state})
		Expect(err).NotTo(HaveOccurred())
		flaky := &flakyRuntime{Runtime: drv}
		flaky.down.Store(true)
		m := env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: flaky}, controllers.Options{NodeName: node})
		DeferCleanup(func() {
			m.Stop()
			Expect(bwrap.DetachTrees(state)).To(Succeed())
		})

		ns := newNamespace()
		sb := newSandbox(ns, "flaky", "flaky", time.Minute)
		sb.Spec.NodeName = node
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "flaky"))).To(Succeed())

		By("the runtime is down: RuntimeUnavailable")
		Eventually(sandboxStatus(ns, "flaky"), timeout).Should(And(
			sandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonRuntimeUnavailable),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionFalse, v1alpha1.ReasonRuntimeUnavailable)),
		))
		// Twelve failed reconciles: the work queue's default back-off
		// (5ms doubling) would now wait about 20s before the next one.
		// (Other events, a claim's status among them, re-queue it too.)
		Eventually(flaky.inspects.Load, timeout).Should(BeNumerically(">=", 12))

		By("the runtime comes back: Ready within 5s, without any change to the objects")
		flaky.down.Store(false)
		back := time.Now()
		Eventually(sandboxStatus(ns, "flaky"), 5*time.Second, 50*time.Millisecond).Should(
			sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimStatus(ns, "c"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		GinkgoWriter.Printf("Ready %s after the runtime came back (%d failed reconciles during the outage)\n", time.Since(back), flaky.inspects.Load())

		deleteAndWait(sb)
	})
})
