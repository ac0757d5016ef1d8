// Package placement_test holds placement end to end: two node controllers
// (two managers in this process, each with its own areas root and bwrap
// state, as two machines would have) against one real kube-apiserver.
// Sandboxes that name no node are spread over them within each node's
// capacity and nodeSelector; when one node's controller stops, its
// Sandboxes report NodeLost and the one whose policy allows it moves.
package placement_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

const (
	leaseNS   = "sandbox-leases"
	lostAfter = 3 * time.Second
)

var (
	env *testharness.Env
	k8s client.Client
	ctx = context.Background()
)

func TestPlacement(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "placement suite")
}

// node is one node's controller.
type node struct {
	name     string
	capacity int
	dir      string
	mgr      *testharness.Manager
	// orphanInterval is the node's --orphan interval; 0: the default.
	orphanInterval time.Duration
}

func (n *node) start() {
	drv, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(n.dir, "state")})
	Expect(err).NotTo(HaveOccurred())
	n.mgr = env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{
		Host:            instance.Host{AreasRoot: filepath.Join(n.dir, "areas"), Home: "/nonexistent-home"},
		NodeName:        n.name,
		Capacity:        n.capacity,
		SystemNamespace: leaseNS,
		NodeLostAfter:   lostAfter,
		OrphanInterval:  n.orphanInterval,
	})
}

func (n *node) stop() {
	if n.mgr != nil {
		n.mgr.Stop()
		n.mgr = nil
	}
}

var nodeA, nodeB *node

var _ = BeforeSuite(func() {
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (hack/install-deps.sh)")
	env = testharness.Start()
	k8s = env.Client
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNS}})).To(Succeed())
	for _, n := range []struct{ name, zone string }{{"node-a", "a"}, {"node-b", "b"}} {
		Expect(k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"zone": n.zone}}})).To(Succeed())
	}
	nodeA = &node{name: "node-a", capacity: 3, dir: filepath.Join(env.Dir, "node-a"), orphanInterval: time.Second}
	// node-b collects orphans at the default interval (5 minutes): what it
	// removes within a spec it removes on its own account.
	nodeB = &node{name: "node-b", capacity: 2, dir: filepath.Join(env.Dir, "node-b")}
	nodeA.start()
	nodeB.start()
})

var _ = AfterSuite(func() {
	for _, n := range []*node{nodeA, nodeB} {
		if n != nil {
			n.stop()
			Expect(bwrap.DetachTrees(filepath.Join(n.dir, "state"))).To(Succeed())
		}
	}
	env.Stop()
})

func sandbox(ns, name string, mutate ...func(*v1alpha1.Sandbox)) *v1alpha1.Sandbox {
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.SandboxSpec{Agent: ns + "-" + name, Binaries: []v1alpha1.BinaryName{"true"}},
	}
	for _, m := range mutate {
		m(sb)
	}
	Expect(k8s.Create(ctx, sb)).To(Succeed())
	return sb
}

// dropSelector clears a Sandbox's nodeSelector; a placed Sandbox stays
// where it is.
func dropSelector(ns, name string) {
	GinkgoHelper()
	Eventually(func() error {
		var sb v1alpha1.Sandbox
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
			return err
		}
		sb.Spec.NodeSelector = nil
		return k8s.Update(ctx, &sb)
	}, testharness.Timeout).Should(Succeed())
}

func nodeOf(ns, name string) func() (string, error) {
	return func() (string, error) {
		st, err := env.SandboxStatus(ns, name)()
		return st.NodeName, err
	}
}

func readyOf(ns, name string) func() (*metav1.Condition, error) {
	return func() (*metav1.Condition, error) {
		st, err := env.SandboxStatus(ns, name)()
		return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady), err
	}
}

func claimReadyOf(ns, name string) func() (*metav1.Condition, error) {
	return func() (*metav1.Condition, error) {
		st, err := env.ClaimStatus(ns, name)()
		return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady), err
	}
}

var _ = Describe("Placement", Ordered, func() {
	var ns string
	BeforeAll(func() { ns = env.NewNamespace() })

	It("spreads Sandboxes that name no node over the live nodes, within capacity, and says which node in status", func() {
		for i := 1; i <= 4; i++ {
			sandbox(ns, fmt.Sprintf("s%d", i))
		}
		count := func() (map[string]int, error) {
			var list v1alpha1.SandboxList
			if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
				return nil, err
			}
			out := map[string]int{}
			for _, sb := range list.Items {
				out[sb.Status.NodeName]++
			}
			return out, nil
		}
		Eventually(count, testharness.Timeout).Should(Equal(map[string]int{"node-a": 2, "node-b": 2}))
		for i := 1; i <= 4; i++ {
			// Each node's controller took its own: the instance is stopped
			// there, as for any Sandbox without claims.
			Eventually(env.SandboxStatus(ns, fmt.Sprintf("s%d", i)), testharness.Timeout).Should(
				testharness.SandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		}
		// The fifth goes where there is room: node-b is full at 2.
		sandbox(ns, "s5")
		Eventually(nodeOf(ns, "s5"), testharness.Timeout).Should(Equal("node-a"))
	})

	It("reports Unschedulable with each node's reason when none can take a Sandbox, and places it once one can", func() {
		sandbox(ns, "zoned", func(sb *v1alpha1.Sandbox) { sb.Spec.NodeSelector = map[string]string{"zone": "b"} })
		Eventually(readyOf(ns, "zoned"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonUnschedulable),
			HaveField("Message", And(ContainSubstring("node-a: does not match nodeSelector"), ContainSubstring("node-b: full (2 of 2)")))))
		Consistently(nodeOf(ns, "zoned"), 2*lostAfter/3).Should(BeEmpty())
		// No node's controller binds its claim meanwhile: the coordinator
		// says why it is not Ready.
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "zoned-claim", "zoned"))).To(Succeed())
		Eventually(claimReadyOf(ns, "zoned-claim"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonSandboxNotReady),
			HaveField("Message", And(ContainSubstring(`Sandbox "zoned" is not ready: Unschedulable`), ContainSubstring("node-b: full (2 of 2)")))))

		var onB string
		for i := 1; i <= 4 && onB == ""; i++ {
			if n, _ := nodeOf(ns, fmt.Sprintf("s%d", i))(); n == "node-b" {
				onB = fmt.Sprintf("s%d", i)
			}
		}
		Expect(onB).NotTo(BeEmpty())
		env.DeleteAndWait(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: onB}})
		Eventually(nodeOf(ns, "zoned"), testharness.Timeout).Should(Equal("node-b"))
		Eventually(env.SandboxStatus(ns, "zoned"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimReadyOf(ns, "zoned-claim"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", v1alpha1.ReasonSandboxReady)))
		env.DeleteAndWait(testharness.NewClaim(ns, "zoned-claim", "zoned"))
		Eventually(env.SandboxStatus(ns, "zoned"), testharness.Timeout).Should(
			testharness.SandboxIs(0, metav1.ConditionTrue, v1alpha1.ReasonIdle))
	})

	It("marks the Sandboxes of a node whose controller stops NodeLost, moves those with onNodeLost: Move, and cleans up when the node is back", func() {
		// Room on node-a for the one that moves.
		var onA []string
		for _, name := range []string{"s1", "s2", "s3", "s4", "s5"} {
			if n, _ := nodeOf(ns, name)(); n == "node-a" {
				onA = append(onA, name)
			}
		}
		Expect(onA).To(HaveLen(3))
		env.DeleteAndWait(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: onA[0]}})

		// On node-b, running, with a claim each: one that stays, and one
		// that may move, for which room is made there.
		var stays string
		for _, name := range []string{"s1", "s2", "s3", "s4", "zoned"} {
			if n, _ := nodeOf(ns, name)(); n == "node-b" && stays == "" {
				stays = name
			}
		}
		Expect(stays).NotTo(BeEmpty())
		var other string
		for _, name := range []string{"s1", "s2", "s3", "s4", "zoned"} {
			if n, _ := nodeOf(ns, name)(); n == "node-b" && name != stays {
				other = name
			}
		}
		env.DeleteAndWait(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: other}})
		sandbox(ns, "mover", func(sb *v1alpha1.Sandbox) {
			sb.Spec.OnNodeLost = v1alpha1.NodeLostMove
			sb.Spec.NodeSelector = map[string]string{"zone": "b"}
		})
		Eventually(nodeOf(ns, "mover"), testharness.Timeout).Should(Equal("node-b"))
		for _, name := range []string{stays, "mover"} {
			Expect(k8s.Create(ctx, testharness.NewClaim(ns, name+"-claim", name))).To(Succeed())
			Eventually(env.SandboxStatus(ns, name), testharness.Timeout).Should(
				testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		}
		// A second claim on the one that stays, deleted while its node is
		// lost.
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, stays+"-extra", stays))).To(Succeed())
		Eventually(env.SandboxStatus(ns, stays), testharness.Timeout).Should(
			testharness.SandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		// The mover's selector names zone b only: it cannot move until the
		// selector allows another node.
		nodeB.stop()
		Eventually(readyOf(ns, stays), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonNodeLost),
			HaveField("Message", And(ContainSubstring("node node-b lost since"), ContainSubstring("stays (onNodeLost: Stay)")))))
		Eventually(readyOf(ns, "mover"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonNodeLost),
			HaveField("Message", ContainSubstring("no other node can take it: node-a: does not match nodeSelector"))))
		// Their claims are not left Ready on a node that is gone.
		for _, name := range []string{stays, "mover"} {
			Eventually(claimReadyOf(ns, name+"-claim"), testharness.Timeout).Should(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonSandboxNotReady),
				HaveField("Message", And(ContainSubstring(fmt.Sprintf("Sandbox %q is not ready: NodeLost", name)), ContainSubstring("node node-b lost since")))))
		}
		// A claim without a worktree, deleted meanwhile, goes without
		// waiting for the node.
		Expect(k8s.Delete(ctx, testharness.NewClaim(ns, stays+"-extra", stays))).To(Succeed())
		Eventually(func() bool {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stays + "-extra"}, &v1alpha1.SessionClaim{})
			return apierrors.IsNotFound(err)
		}, testharness.Timeout).Should(BeTrue(), "a deleted claim without a worktree waits for the lost node")

		dropSelector(ns, "mover")
		Eventually(nodeOf(ns, "mover"), testharness.Timeout).Should(Equal("node-a"))
		Eventually(readyOf(ns, "mover"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", v1alpha1.ReasonRunning)),
			"its claim is served on node-a now")
		Eventually(env.ClaimStatus(ns, "mover-claim"), testharness.Timeout).Should(
			HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		Expect(readyOf(ns, stays)()).To(HaveField("Reason", v1alpha1.ReasonNodeLost), "a Sandbox that stays waits for its node")

		// node-b's controller comes back: the one that stayed runs again
		// there, the instance of the one that moved away is removed, and
		// its areas on node-b are left alone.
		instName := v1alpha1.InstanceName(ns + "-mover")
		Expect(filepath.Join(nodeB.dir, "areas", ns+"-mover", "workspace")).To(BeADirectory())
		nodeB.start()
		Eventually(env.SandboxStatus(ns, stays), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimReadyOf(ns, stays+"-claim"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", v1alpha1.ReasonSandboxReady)), "the node that is back serves its claim again")
		Eventually(func() (bool, error) {
			st, err := nodeB.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)
			return st.Exists, err
		}, testharness.Timeout).Should(BeFalse(), "the instance the mover left on node-b is removed")
		Expect(filepath.Join(nodeB.dir, "areas", ns+"-mover", "workspace")).To(BeADirectory(), "areas on the lost node stay")
		Expect(nodeOf(ns, "mover")()).To(Equal("node-a"))
	})

	It("counts a node whose Lease is deleted lost, and moves off it a Sandbox that may move", func() {
		// Room on node-a (3 of 3) for the one that moves.
		env.DeleteAndWait(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mover"}})
		sandbox(ns, "leaseless", func(sb *v1alpha1.Sandbox) {
			sb.Spec.OnNodeLost = v1alpha1.NodeLostMove
			sb.Spec.NodeSelector = map[string]string{"zone": "b"}
		})
		Eventually(nodeOf(ns, "leaseless"), testharness.Timeout).Should(Equal("node-b"))
		// Placed: the selector may go now, the Sandbox stays where it is.
		dropSelector(ns, "leaseless")

		// node-b's controller goes and its Lease with it, before the
		// Lease could count as not renewed.
		nodeB.stop()
		DeferCleanup(nodeB.start)
		Expect(k8s.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: leaseNS, Name: controllers.NodeLeaseName("node-b")}})).To(Succeed())
		Eventually(nodeOf(ns, "leaseless"), testharness.Timeout).Should(Equal("node-a"))
		Eventually(func() (string, error) {
			var events corev1.EventList
			if err := k8s.List(ctx, &events, client.InNamespace(ns), client.MatchingFields{"involvedObject.name": "leaseless"}); err != nil {
				return "", err
			}
			for _, e := range events.Items {
				if e.Reason == v1alpha1.ReasonNodeLost {
					return e.Message, nil
				}
			}
			return "", nil
		}, testharness.Timeout).Should(ContainSubstring("node node-b lost since"), "a NodeLost event says why it moved")
	})

	It("stops running at once a Sandbox moved off a node that was counted lost while it was not", func() {
		sandbox(ns, "twice", func(sb *v1alpha1.Sandbox) { sb.Spec.NodeSelector = map[string]string{"zone": "b"} })
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "twice-claim", "twice"))).To(Succeed())
		Eventually(nodeOf(ns, "twice"), testharness.Timeout).Should(Equal("node-b"))
		Eventually(env.SandboxStatus(ns, "twice"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		instName := v1alpha1.InstanceName(ns + "-twice")
		st, err := nodeB.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Running).To(BeTrue())

		// What the coordinator writes when it counts node-b lost and moves
		// the Sandbox, while node-b's controller is in fact alive.
		dropSelector(ns, "twice")
		Eventually(func() error {
			var sb v1alpha1.Sandbox
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "twice"}, &sb); err != nil {
				return err
			}
			sb.Status.NodeName = "node-a"
			return k8s.Status().Update(ctx, &sb)
		}, testharness.Timeout).Should(Succeed())
		Eventually(func() (bool, error) {
			st, err := nodeB.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)
			return st.Exists, err
		}, testharness.Timeout).Should(BeFalse(), "node-b removes its instance as soon as the Sandbox is on another node, not at its next orphan collection")
		Eventually(env.SandboxStatus(ns, "twice"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Expect(nodeA.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)).To(HaveField("Running", BeTrue()), "node-a runs it now")
	})
})
