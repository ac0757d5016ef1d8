package controllers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

const timeout = testharness.Timeout

func newSandbox(ns, name, agent string, idle time.Duration) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.SandboxSpec{
			Agent:       agent,
			Binaries:    []v1alpha1.BinaryName{"sh", "true"},
			IdleTimeout: &metav1.Duration{Duration: idle},
		},
	}
}

var (
	newClaim      = testharness.NewClaim
	haveCondition = testharness.HaveCondition
	sandboxIs     = testharness.SandboxIs
)

func newNamespace() string            { return env.NewNamespace() }
func deleteAndWait(obj client.Object) { env.DeleteAndWait(obj) }
func sandboxStatus(ns, name string) func() (v1alpha1.SandboxStatus, error) {
	return env.SandboxStatus(ns, name)
}
func claimStatus(ns, name string) func() (v1alpha1.SessionClaimStatus, error) {
	return env.ClaimStatus(ns, name)
}

var _ = Describe("Sandbox refcounting", func() {
	It("ensures once on 0→1, keeps running through 1→2→1, and stops once only after idleTimeout on 1→0", func() {
		ns := newNamespace()
		const idle = 2 * time.Second
		sb := newSandbox(ns, "counted", "counted", idle)
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		inst := v1alpha1.InstanceName("counted")
		rt := mgr.rt

		By("no claims: stopped, nothing ensured")
		Eventually(sandboxStatus(ns, "counted"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(rt.Count("Ensure", inst)).To(Equal(0))

		By("0→1: the instance is ensured once and Ready")
		c1 := newClaim(ns, "c1", "counted")
		Expect(k8s.Create(ctx, c1)).To(Succeed())
		Eventually(sandboxStatus(ns, "counted"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Expect(rt.Count("Ensure", inst)).To(Equal(1))
		Eventually(claimStatus(ns, "c1"), timeout).Should(And(
			HaveField("Instance", inst),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionBound, metav1.ConditionTrue, v1alpha1.ReasonBound)),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)),
		))
		// The claim waited for its Sandbox to start (startingFor) and said
		// Bound and Ready in one write, not Bound first.
		Expect(mgr.Writes.Of("sessionclaims", ns, "c1")).To(Equal(1))

		By("1→2: no second Ensure")
		c2 := newClaim(ns, "c2", "counted")
		Expect(k8s.Create(ctx, c2)).To(Succeed())
		Eventually(sandboxStatus(ns, "counted"), timeout).Should(sandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		By("2→1: still running, no Stop")
		deleteAndWait(c1)
		Eventually(sandboxStatus(ns, "counted"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Expect(rt.Count("Stop", inst)).To(Equal(0))

		By("1→0: idle first, stopped only after idleTimeout")
		deleteAndWait(c2)
		released := time.Now()
		Eventually(sandboxStatus(ns, "counted"), timeout).Should(sandboxIs(0, metav1.ConditionTrue, v1alpha1.ReasonIdle))
		Expect(rt.Count("Stop", inst)).To(Equal(0))
		Eventually(sandboxStatus(ns, "counted"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		stops := rt.Times("Stop", inst)
		Expect(stops).To(HaveLen(1))
		Expect(stops[0].Sub(released)).To(BeNumerically(">=", idle-100*time.Millisecond),
			"Stop came %s after the last claim went; idleTimeout is %s", stops[0].Sub(released), idle)
		Expect(rt.Count("Ensure", inst)).To(Equal(1))

		st, err := rt.Inspect(ctx, inst)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Exists).To(BeTrue())
		Expect(st.Running).To(BeFalse())
		Consistently(func() int { return rt.Count("Stop", inst) }, 1500*time.Millisecond).Should(Equal(1))
	})

	It("keeps the instance running with keepRunning after the last claim goes", func() {
		ns := newNamespace()
		sb := newSandbox(ns, "kept", "kept", time.Second)
		sb.Spec.KeepRunning = true
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		c := newClaim(ns, "only", "kept")
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Eventually(sandboxStatus(ns, "kept"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		deleteAndWait(c)
		Eventually(sandboxStatus(ns, "kept"), timeout).Should(sandboxIs(0, metav1.ConditionTrue, v1alpha1.ReasonIdle))
		Consistently(func() int { return mgr.rt.Count("Stop", v1alpha1.InstanceName("kept")) }, 2500*time.Millisecond).Should(Equal(0))
	})
})

var _ = Describe("Sandbox finalizer", func() {
	It("adds its finalizer without rewriting the spec: the generation stays 1 for a spec Go would encode otherwise", func() {
		ns := newNamespace()
		// As kubectl apply sends it: "5m", which Go encodes as "5m0s".
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Sandbox",
			"metadata": map[string]any{"namespace": ns, "name": "applied"},
			"spec":     map[string]any{"agent": ns + "-applied", "binaries": []any{"true"}, "idleTimeout": "5m"},
		}}
		Expect(k8s.Create(ctx, u)).To(Succeed())
		Eventually(func() (*v1alpha1.Sandbox, error) {
			var sb v1alpha1.Sandbox
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "applied"}, &sb)
			return &sb, err
		}, timeout).Should(And(
			HaveField("Finalizers", ContainElement(v1alpha1.Finalizer)),
			HaveField("Status.ObservedGeneration", BeEquivalentTo(1)),
			HaveField("Generation", BeEquivalentTo(1))))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "applied"}, u)).To(Succeed())
		idle, _, _ := unstructured.NestedString(u.Object, "spec", "idleTimeout")
		Expect(idle).To(Equal("5m"), "the spec is as the user wrote it")
	})
})

var _ = Describe("SessionClaim binding", func() {
	It("binds a claim created before its Sandbox once the Sandbox appears", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, newClaim(ns, "early", "late"))).To(Succeed())
		Eventually(claimStatus(ns, "early"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionBound, metav1.ConditionFalse, v1alpha1.ReasonSandboxNotFound)))

		Expect(k8s.Create(ctx, newSandbox(ns, "late", "late", time.Minute))).To(Succeed())
		Eventually(claimStatus(ns, "early"), timeout).Should(And(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionBound, metav1.ConditionTrue, v1alpha1.ReasonBound)),
			HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)),
		))
		Eventually(sandboxStatus(ns, "late"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		// Without a worktree the status is the claim's one write: no
		// finalizer (nothing to release) and no owner reference (a deleted
		// Sandbox deletes its claims itself, see "Sandbox deletion").
		var c v1alpha1.SessionClaim
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "early"}, &c)).To(Succeed())
		Expect(c.Finalizers).To(BeEmpty())
		Expect(c.OwnerReferences).To(BeEmpty())
	})
})

var _ = Describe("A cold claim's Ready", func() {
	It("is written beside its Sandbox's status, not after it comes back", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, newSandbox(ns, "cold", ns+"-cold", time.Minute))).To(Succeed())
		Eventually(sandboxStatus(ns, "cold"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))

		// The Sandbox's status write stands on its way, held for as long
		// as the claim is waited for; the claim's Ready must not wait for
		// it. Without notices it would wait its startGrace, say Bound and
		// not Ready, and say Ready only once the held write came back:
		// never within this wait, however long, so the wait is the
		// suite's own and a loaded machine's slow start is no failure.
		release := mgr.Writes.Hold("sandboxes", ns, "cold")
		defer release()
		Expect(k8s.Create(ctx, newClaim(ns, "first", "cold"))).To(Succeed())
		Eventually(claimStatus(ns, "first"), timeout).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		Expect(sandboxStatus(ns, "cold")()).To(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped), "the Sandbox's write was held")

		release()
		Eventually(sandboxStatus(ns, "cold"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Consistently(claimStatus(ns, "first"), time.Second).Should(
			HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
	})
})

var _ = Describe("Sandbox deletion", func() {
	It("deletes the claims, then the instance, and keeps the host areas and their files", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, newSandbox(ns, "doomed", "doomed", time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "d1", "doomed"))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "d2", "doomed"))).To(Succeed())
		Eventually(sandboxStatus(ns, "doomed"), timeout).Should(sandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		work := filepath.Join(areasRoot, "doomed", "workspace", "notes.txt")
		Expect(os.WriteFile(work, []byte("agent data"), 0o644)).To(Succeed())

		var sb v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "doomed"}, &sb)).To(Succeed())
		deleteAndWait(&sb)

		for _, name := range []string{"d1", "d2"} {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &v1alpha1.SessionClaim{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "claim %s should be gone, got %v", name, err)
		}
		inst := v1alpha1.InstanceName("doomed")
		Expect(mgr.rt.Count("Delete", inst)).To(Equal(1))
		st, err := mgr.rt.Inspect(ctx, inst)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Exists).To(BeFalse())

		Expect(os.ReadFile(work)).To(Equal([]byte("agent data")))
		for _, area := range []string{"workspace", "memories", "blocks", "skills", "tasks"} {
			Expect(filepath.Join(areasRoot, "doomed", area)).To(BeADirectory())
		}
	})
})

var _ = Describe("Sandbox and claims deleted together", func() {
	It("leaves the claims to whoever deletes them with the Sandbox, as kubectl delete -f does, then deletes the rest", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, newSandbox(ns, "pair", "pair", time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "mine", "pair"))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "left", "pair"))).To(Succeed())
		Eventually(sandboxStatus(ns, "pair"), timeout).Should(sandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		var sb v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pair"}, &sb)).To(Succeed())
		Expect(k8s.Delete(ctx, &sb)).To(Succeed())
		// kubectl deletes the next object of the file a moment later; the
		// claim has no finalizer, so only the controller waiting keeps it.
		time.Sleep(300 * time.Millisecond)
		mine := &v1alpha1.SessionClaim{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine"}, mine)).To(Succeed())
		Expect(k8s.Delete(ctx, mine)).To(Succeed())

		// The claim nobody deleted goes with the Sandbox all the same.
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pair"}, &v1alpha1.Sandbox{}))
		}, timeout).Should(BeTrue())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "left"}, &v1alpha1.SessionClaim{}))).To(BeTrue())
	})
})

var _ = Describe("Name conflicts", func() {
	// conditionWith matches a condition of the given type, status and
	// reason whose message contains want.
	conditionWith := func(typ string, status metav1.ConditionStatus, reason, want string) OmegaMatcher {
		return ContainElement(And(
			HaveField("Type", typ), HaveField("Status", status), HaveField("Reason", reason), HaveField("Message", ContainSubstring(want))))
	}

	It("never gives one namespace's agent to another: the newer Sandbox's claim is not Bound, and stays unbound after the older one goes", func() {
		nsA, nsB := newNamespace(), newNamespace()
		const agent = "tenant-alice"
		inst := v1alpha1.InstanceName(agent)
		Expect(k8s.Create(ctx, newSandbox(nsA, "alice", agent, time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(nsA, "a", "alice"))).To(Succeed())
		Eventually(sandboxStatus(nsA, "alice"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		work := filepath.Join(areasRoot, agent, "workspace", "plan.txt")
		Expect(os.WriteFile(work, []byte("namespace a's plan"), 0o644)).To(Succeed())

		// Creation timestamps have whole-second resolution.
		time.Sleep(1100 * time.Millisecond)
		Expect(k8s.Create(ctx, newSandbox(nsB, "alice", agent, time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(nsB, "b", "alice"))).To(Succeed())

		By("refusing b's claim with the reason, naming a's Sandbox")
		taken := fmt.Sprintf("Sandbox %s/alice already uses agent %q", nsA, agent)
		Eventually(claimStatus(nsB, "b"), timeout).Should(HaveField("Conditions", And(
			conditionWith(v1alpha1.ConditionBound, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, taken),
			conditionWith(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, taken))))
		Eventually(sandboxStatus(nsB, "alice"), timeout).Should(HaveField("Conditions",
			conditionWith(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, taken)))
		Expect(claimStatus(nsB, "b")()).To(HaveField("Instance", BeEmpty()))

		By("telling b none of what a's instance uses")
		Eventually(func() map[string]float64 { return usageMetricsOf(nsA, "alice") }, timeout).Should(HaveKey("sandbox_memory_bytes"))
		Expect(usageMetricsOf(nsB, "alice")).To(BeEmpty(), "namespace b's Sandbox of the same agent is not its instance's owner")

		By("keeping the agent's areas a's after a's Sandbox is gone")
		var first v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "alice"}, &first)).To(Succeed())
		deleteAndWait(&first)
		belongs := fmt.Sprintf("the areas of agent %q on this node belong to namespace %q", agent, nsA)
		Eventually(claimStatus(nsB, "b"), timeout).Should(HaveField("Conditions",
			conditionWith(v1alpha1.ConditionBound, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, belongs)))
		Eventually(sandboxStatus(nsB, "alice"), timeout).Should(HaveField("Conditions",
			conditionWith(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, belongs)))
		st, err := mgr.rt.Inspect(ctx, inst)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Exists).To(BeFalse(), "namespace b's Sandbox got the instance: %+v", st)
		Expect(os.ReadFile(work)).To(Equal([]byte("namespace a's plan")))
	})

	It("does not bind a claim on a Sandbox whose instance something else owns", func() {
		ns := newNamespace()
		const agent = "foreign-owned"
		foreign, err := testharness.DescribeAs(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "foreign"}, Spec: v1alpha1.SandboxSpec{Agent: agent}}, instance.Host{AreasRoot: areasRoot})
		Expect(err).NotTo(HaveOccurred())
		_, err = mgr.rt.Ensure(ctx, foreign)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.rt.Delete(ctx, foreign.Name)).To(Succeed()) })

		Expect(k8s.Create(ctx, newSandbox(ns, "mine", agent, time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "mine"))).To(Succeed())
		belongs := fmt.Sprintf("instance %s exists and belongs to elsewhere/foreign", foreign.Name)
		Eventually(sandboxStatus(ns, "mine"), timeout).Should(HaveField("Conditions",
			conditionWith(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, belongs)))
		Eventually(claimStatus(ns, "c"), timeout).Should(HaveField("Conditions",
			conditionWith(v1alpha1.ConditionBound, metav1.ConditionFalse, v1alpha1.ReasonNameConflict, belongs)))
		st, err := mgr.rt.Inspect(ctx, foreign.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Owner).To(Equal("elsewhere/foreign"))
	})

	It("hands the agent over to the next Sandbox of the same namespace when the older one goes", func() {
		ns := newNamespace()
		const agent = "handed-over"
		Expect(k8s.Create(ctx, newSandbox(ns, "first", agent, time.Minute))).To(Succeed())
		Eventually(sandboxStatus(ns, "first"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		// Creation timestamps have whole-second resolution.
		time.Sleep(1100 * time.Millisecond)
		Expect(k8s.Create(ctx, newSandbox(ns, "second", agent, time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "a", "first"))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "b", "second"))).To(Succeed())

		Eventually(sandboxStatus(ns, "first"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(sandboxStatus(ns, "second"), timeout).Should(sandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonNameConflict))
		Eventually(claimStatus(ns, "b"), timeout).Should(HaveField("Conditions", haveCondition(v1alpha1.ConditionBound, metav1.ConditionFalse, v1alpha1.ReasonNameConflict)))

		var first v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "first"}, &first)).To(Succeed())
		deleteAndWait(&first)
		Eventually(sandboxStatus(ns, "second"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimStatus(ns, "b"), timeout).Should(HaveField("Conditions", haveCondition(v1alpha1.ConditionBound, metav1.ConditionTrue, v1alpha1.ReasonBound)))
		st, err := mgr.rt.Inspect(ctx, v1alpha1.InstanceName(agent))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Owner).To(Equal(ns + "/second"))
	})
})

var _ = Describe("Controller restart", Ordered, func() {
	It("adopts the running instance instead of recreating it", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, newSandbox(ns, "survivor", "survivor", time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "held", "survivor"))).To(Succeed())
		Eventually(sandboxStatus(ns, "survivor"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		inst := v1alpha1.InstanceName("survivor")
		before, err := mgr.rt.Inspect(ctx, inst)
		Expect(err).NotTo(HaveOccurred())
		Expect(before.Running).To(BeTrue())

		By("an instance whose Sandbox is gone is left behind while the controller is down")
		ghostSpec := &v1alpha1.SandboxSpec{Agent: "ghost"}
		ghost, err := testharness.DescribeAs(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "nowhere", Name: "ghost"}, Spec: *ghostSpec}, instance.Host{AreasRoot: areasRoot})
		Expect(err).NotTo(HaveOccurred())
		mgr.stop()
		_, err = mgr.rt.Ensure(ctx, ghost)
		Expect(err).NotTo(HaveOccurred())

		mgr = startManager()

		By("the restarted controller deletes the orphan and keeps its areas")
		Eventually(func() bool {
			st, err := mgr.rt.Inspect(ctx, ghost.Name)
			return err == nil && !st.Exists
		}, timeout).Should(BeTrue())
		Expect(filepath.Join(areasRoot, "ghost", "workspace")).To(BeADirectory())

		Eventually(func() int { return mgr.rt.Count("Inspect", inst) }, timeout).Should(BeNumerically(">=", 1))
		Consistently(func() int { return mgr.rt.Count("Ensure", inst) }, 2*time.Second).Should(Equal(0))
		after, err := mgr.rt.Inspect(ctx, inst)
		Expect(err).NotTo(HaveOccurred())
		Expect(after.Running).To(BeTrue())
		Expect(after.CreatedAt).To(Equal(before.CreatedAt))
		Expect(sandboxStatus(ns, "survivor")()).To(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
	})
})

var _ = Describe("Insecure sandbox disable", func() {
	It("marks every bwrap Sandbox when the controller runs with a bypass value, and only then", func() {
		ns := newNamespace()
		DeferCleanup(func() { controllerEnv.Delete(policy.DisableSandboxEnv) })

		controllerEnv.Store(policy.DisableSandboxEnv, "I-AM-IN-A-CONTAINER")
		Expect(k8s.Create(ctx, newSandbox(ns, "near-miss", "near-miss", time.Minute))).To(Succeed())
		Eventually(sandboxStatus(ns, "near-miss"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionSandboxEnforced, metav1.ConditionTrue, v1alpha1.ReasonEnforced)))

		controllerEnv.Store(policy.DisableSandboxEnv, "i-am-in-a-container")
		Expect(k8s.Create(ctx, newSandbox(ns, "exposed", "exposed", time.Minute))).To(Succeed())
		Eventually(sandboxStatus(ns, "exposed"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionSandboxEnforced, metav1.ConditionFalse, v1alpha1.ReasonSandboxDisabled)))
		Eventually(func() ([]string, error) {
			var evs corev1.EventList
			err := k8s.List(ctx, &evs, client.InNamespace(ns))
			var reasons []string
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == "exposed" {
					reasons = append(reasons, e.Reason)
				}
			}
			return reasons, err
		}, timeout).Should(ContainElement(v1alpha1.ReasonSandboxDisabled))
	})
})
