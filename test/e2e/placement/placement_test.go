// Package placement_test holds placement end to end: the placer (as the
// aggregated API's Deployment runs it), a real kube-scheduler and two node
// controllers (two managers in this process, each with its own areas root
// and bwrap state, as two machines would have) against one real
// kube-apiserver. Each Sandbox gets a Pod that kube-scheduler binds by its
// requests, selector and backend, and the node it is bound to runs it.
//
// There is no kubelet: the two Nodes are objects whose room and readiness
// the suite writes, and each node controller's DaemonSet pod is a Pod bound
// to its Node, as the DaemonSet controller would make it. Where a node is
// lost, the suite does what the node lifecycle controller does (the Node
// not Ready, the unreachable taint, the eviction of the Pods that do not
// tolerate it); make test-cluster shows it with the real one.
package placement_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/config/admission"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

const systemNS = "sandbox-system"

// holderImage is the controller's image as the placer knows it.
const holderImage = "example.test/sandbox-controller:v1"

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
	name string
	dir  string
	mgr  *testharness.Manager
	// orphanInterval is the node's --orphan interval; 0: the default.
	orphanInterval time.Duration
}

func (n *node) start() {
	drv, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(n.dir, "state")})
	Expect(err).NotTo(HaveOccurred())
	n.mgr = env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{
		Host:           instance.Host{AreasRoot: filepath.Join(n.dir, "areas"), Home: "/nonexistent-home"},
		NodeName:       n.name,
		OrphanInterval: n.orphanInterval,
	})
}

func (n *node) stop() {
	if n.mgr != nil {
		n.mgr.Stop()
		n.mgr = nil
	}
}

var (
	nodeA, nodeB *node
	scheduler    *testharness.Scheduler
	placement    *testharness.Manager
)

// nodeMemory is each Node's allocatable memory: two Sandboxes requesting
// 600Mi fit on one, three do not.
const nodeMemory = "1536Mi"

// addNode makes a Node as a kubelet registers one (Ready, with room), and
// the pod of our DaemonSet bound to it, enabling bwrap.
func addNode(name, zone string) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"zone": zone, corev1.LabelHostname: name}}}
	Expect(k8s.Create(ctx, n)).To(Succeed())
	room := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse(nodeMemory), corev1.ResourcePods: resource.MustParse("110")}
	n.Status = corev1.NodeStatus{Capacity: room, Allocatable: room}
	Expect(k8s.Status().Update(ctx, n)).To(Succeed())
	// Admission gave it the not-ready taint, which the node lifecycle
	// controller removes once the kubelet says Ready.
	setNodeReady(name, true)
	Expect(k8s.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "sandbox-controller-" + name, Labels: map[string]string{
			"app.kubernetes.io/name": "sandbox-controller", controllers.LabelBackendPrefix + "bwrap": "true"}},
		Spec: corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "manager", Image: "sandbox-controller"}}},
	})).To(Succeed())
}

// setNodeReady writes a Node's Ready condition, and its taints as the node
// lifecycle controller keeps them: none for a Ready node, the unreachable
// ones for a node it stopped hearing from.
func setNodeReady(name string, ready bool) {
	GinkgoHelper()
	Eventually(func() error {
		var n corev1.Node
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		c := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
		if !ready {
			c.Status, c.Reason, c.Message = corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status."
		}
		n.Status.Conditions = []corev1.NodeCondition{c}
		if err := k8s.Status().Update(ctx, &n); err != nil {
			return err
		}
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		n.Spec.Taints = nil
		if !ready {
			n.Spec.Taints = []corev1.Taint{
				{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
				{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: ptr.To(metav1.Now())},
			}
		}
		return k8s.Update(ctx, &n)
	}, testharness.Timeout).Should(Succeed())
}

var _ = BeforeSuite(func() {
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (hack/install-deps.sh)")
	env = testharness.Start()
	k8s = env.Client
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS}})).To(Succeed())
	// As make deploy installs it: a new unpinned Sandbox carries the
	// finalizer from its create, and no node's controller writes it.
	Expect(admission.InstallFinalizer(ctx, k8s, systemNS, testharness.Timeout)).To(Succeed())
	installSandboxPodPolicy()
	addNode("node-a", "a")
	addNode("node-b", "b")
	scheduler = env.StartScheduler()
	placement = env.StartPlacer(controllers.PlacementOptions{SystemNamespace: systemNS, NodeLostAfter: 2 * time.Second, HolderImage: holderImage})
	nodeA = &node{name: "node-a", dir: filepath.Join(env.Dir, "node-a"), orphanInterval: time.Second}
	// node-b collects orphans at the default interval (5 minutes): what it
	// removes within a spec it removes on its own account.
	nodeB = &node{name: "node-b", dir: filepath.Join(env.Dir, "node-b")}
	nodeA.start()
	nodeB.start()
})

var _ = AfterSuite(func() {
	if scheduler != nil && !scheduler.Running() {
		b, _ := os.ReadFile(scheduler.Log)
		GinkgoWriter.Printf("kube-scheduler exited; its log:\n%s\n", b)
	}
	scheduler.Stop()
	if placement != nil {
		placement.Stop()
	}
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
		Spec: v1alpha1.SandboxSpec{Agent: ns + "-" + name, Binaries: []v1alpha1.BinaryName{"true"},
			Resources: &v1alpha1.Resources{Requests: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("600Mi"))}}},
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

func podRefOf(ns, name string) func() (*v1alpha1.SandboxPod, error) {
	return func() (*v1alpha1.SandboxPod, error) {
		st, err := env.SandboxStatus(ns, name)()
		return st.Pod, err
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

// podOf is the Pod that stands for a Sandbox now: the newest not being
// deleted.
func podOf(ns, name string) func() (*corev1.Pod, error) {
	return func() (*corev1.Pod, error) {
		var sb v1alpha1.Sandbox
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
			return nil, err
		}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{controllers.LabelSandboxUID: string(sb.UID)}); err != nil {
			return nil, err
		}
		var cur *corev1.Pod
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp.IsZero() && (cur == nil || attempt(p) > attempt(cur)) {
				cur = p
			}
		}
		return cur, nil
	}
}

func attempt(p *corev1.Pod) int {
	k, _ := strconv.Atoi(p.Annotations["sandbox.cireilclaw.dev/attempt"])
	return k
}

// remove deletes a Sandbox, waits until it is gone, and deletes its Pods
// as the garbage collector of a cluster would (envtest runs none), so the
// room they held is free.
func remove(ns, name string) {
	GinkgoHelper()
	var sb v1alpha1.Sandbox
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb)).To(Succeed())
	env.DeleteAndWait(&sb)
	Expect(k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.MatchingLabels{controllers.LabelSandboxUID: string(sb.UID)},
		client.GracePeriodSeconds(0))).To(Succeed())
}

func countByNode(ns string) func() (map[string]int, error) {
	return func() (map[string]int, error) {
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
}

var _ = Describe("Placement", Ordered, func() {
	var ns string
	BeforeAll(func() { ns = env.NewNamespace() })

	It("gives each Sandbox a Pod that kube-scheduler binds by its requests, and the node it is bound to runs it", func() {
		for i := 1; i <= 4; i++ {
			sandbox(ns, fmt.Sprintf("s%d", i))
		}
		// 600Mi each on nodes of 1536Mi: two on each.
		Eventually(countByNode(ns), testharness.Timeout).Should(Equal(map[string]int{"node-a": 2, "node-b": 2}))
		for i := 1; i <= 4; i++ {
			name := fmt.Sprintf("s%d", i)
			pod, err := podOf(ns, name)()
			Expect(err).NotTo(HaveOccurred())
			Expect(pod).NotTo(BeNil())
			Expect(pod.Spec.Containers[0].Resources.Requests.Memory().String()).To(Equal("600Mi"))
			Expect(nodeOf(ns, name)()).To(Equal(pod.Spec.NodeName), "status.nodeName is the Pod's node")
			Eventually(podRefOf(ns, name), testharness.Timeout).Should(Equal(&v1alpha1.SandboxPod{Name: pod.Name, UID: string(pod.UID)}),
				"status.pod names the Pod, in whose cgroup its node runs it")
			// Each node's controller took its own: the instance is stopped
			// there, as for any Sandbox without claims.
			Eventually(env.SandboxStatus(ns, name), testharness.Timeout).Should(
				testharness.SandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		}

		By("a Pod whose container the kubelet cannot start says why on its Sandbox")
		pod, err := podOf(ns, "s1")()
		Expect(err).NotTo(HaveOccurred())
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "sandbox", Image: pod.Spec.Containers[0].Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "no registry reachable"}}}}
		Expect(k8s.Status().Update(ctx, pod)).To(Succeed())
		Eventually(func() []string {
			var events corev1.EventList
			Expect(k8s.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
			var out []string
			for _, e := range events.Items {
				if e.InvolvedObject.Kind == "Sandbox" && e.InvolvedObject.Name == "s1" && e.Reason == controllers.EventPodNotRunning {
					out = append(out, e.Message)
				}
			}
			return out
		}, testharness.Timeout).Should(ContainElement(ContainSubstring("ErrImagePull: no registry reachable")))
	})

	It("keeps a Sandbox no node has room for Unschedulable in the scheduler's words, and places it once one has", func() {
		sandbox(ns, "s5")
		Eventually(readyOf(ns, "s5"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonUnschedulable),
			HaveField("Message", And(ContainSubstring("0/2 nodes are available"), ContainSubstring("Insufficient memory")))))
		// No node's controller binds its claim meanwhile: the placer says
		// why it is not Ready.
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "s5-claim", "s5"))).To(Succeed())
		Eventually(claimReadyOf(ns, "s5-claim"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonSandboxNotReady),
			HaveField("Message", And(ContainSubstring(`Sandbox "s5" is not ready: Unschedulable`), ContainSubstring("Insufficient memory")))))

		freed, err := nodeOf(ns, "s1")()
		Expect(err).NotTo(HaveOccurred())
		remove(ns, "s1")
		Eventually(nodeOf(ns, "s5"), testharness.Timeout).Should(Equal(freed))
		Eventually(env.SandboxStatus(ns, "s5"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimReadyOf(ns, "s5-claim"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", v1alpha1.ReasonSandboxReady)))
	})

	It("schedules a Sandbox only beside a node controller that enables its backend", func() {
		sandbox(ns, "ctrd", func(sb *v1alpha1.Sandbox) {
			sb.Spec.Resources = nil
			sb.Spec.Backend = v1alpha1.BackendContainerd
			sb.Spec.Containerd = &v1alpha1.ContainerdSpec{Image: "example.test/agent:1"}
		})
		Eventually(readyOf(ns, "ctrd"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonUnschedulable),
			HaveField("Message", ContainSubstring("pod affinity"))))
		Consistently(nodeOf(ns, "ctrd"), 3*time.Second).Should(BeEmpty())
		remove(ns, "ctrd")
	})

	It("lets a Sandbox that no node took go when it is deleted, though the admission policy gave it the finalizer", func() {
		sb := sandbox(ns, "never-placed", func(sb *v1alpha1.Sandbox) {
			sb.Spec.Resources = nil
			sb.Spec.Backend = v1alpha1.BackendContainerd
			sb.Spec.Containerd = &v1alpha1.ContainerdSpec{Image: "example.test/agent:1"}
		})
		Expect(sb.Finalizers).To(ContainElement(v1alpha1.Finalizer), "the policy should give a new Sandbox the finalizer as it is stored")
		Eventually(readyOf(ns, "never-placed"), testharness.Timeout).Should(HaveField("Reason", v1alpha1.ReasonUnschedulable))
		// No node's controller will remove it; the placer does.
		remove(ns, "never-placed")
	})

	It("leaves the finalizer of a Sandbox pinned to a node to that node's controller, so one pinned to no node's is deleted at once", func() {
		sb := sandbox(ns, "pinned-nowhere", func(sb *v1alpha1.Sandbox) { sb.Spec.NodeName = "node-z" })
		Expect(sb.Finalizers).To(BeEmpty())
		remove(ns, "pinned-nowhere")
		pinned := sandbox(ns, "pinned-a", func(sb *v1alpha1.Sandbox) { sb.Spec.NodeName = "node-a"; sb.Spec.Resources = nil })
		Expect(pinned.Finalizers).To(BeEmpty())
		Eventually(func() ([]string, error) {
			err := k8s.Get(ctx, client.ObjectKeyFromObject(pinned), pinned)
			return pinned.Finalizers, err
		}, testharness.Timeout).Should(ContainElement(v1alpha1.Finalizer), "node-a's controller should add the finalizer of a Sandbox pinned to it")
		remove(ns, "pinned-a")
	})

	It("reports a ResourceQuota's refusal in the API server's words, and places the Sandbox once the quota allows it", func() {
		quotaNS := env.NewNamespace()
		q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: quotaNS, Name: "no-pods"},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}
		Expect(k8s.Create(ctx, q)).To(Succeed())
		// What kube-controller-manager's quota controller writes; the API
		// server's quota admission counts against it.
		setQuota := func(pods string) {
			Eventually(func() error {
				if err := k8s.Get(ctx, client.ObjectKeyFromObject(q), q); err != nil {
					return err
				}
				q.Spec.Hard = corev1.ResourceList{corev1.ResourcePods: resource.MustParse(pods)}
				if err := k8s.Update(ctx, q); err != nil {
					return err
				}
				q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
				return k8s.Status().Update(ctx, q)
			}, testharness.Timeout).Should(Succeed())
		}
		setQuota("0")
		sandbox(quotaNS, "over", func(sb *v1alpha1.Sandbox) { sb.Spec.Resources = nil })
		Eventually(readyOf(quotaNS, "over"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonPodRefused),
			HaveField("Message", And(ContainSubstring("exceeded quota: no-pods"), ContainSubstring("pods=0")))))
		setQuota("1")
		Eventually(nodeOf(quotaNS, "over"), testharness.Timeout).ShouldNot(BeEmpty())
		Eventually(env.SandboxStatus(quotaNS, "over"), testharness.Timeout).Should(
			testharness.SandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		remove(quotaNS, "over")
	})

	It("makes no Pod for a Sandbox whose class forbids what its Pod would carry, makes it once the class allows it, and removes it when the class forbids it again", func() {
		// Not the default class: the suite's other Sandboxes name none.
		class := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "placement-scheduling"},
			Spec: v1alpha1.SandboxClassSpec{AllowedBackends: []v1alpha1.Backend{v1alpha1.BackendBwrap},
				Scheduling: v1alpha1.ClassScheduling{AllowedTolerations: []string{"gpu"}}}}
		Expect(k8s.Create(ctx, class)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(class) })
		// No admission policy of classes in this suite: the placer is the
		// first to see it.
		sandbox(ns, "tolerant", func(sb *v1alpha1.Sandbox) {
			sb.Spec.Resources, sb.Spec.ClassName = nil, class.Name
			sb.Spec.Tolerations = []v1alpha1.Toleration{{Key: "dedicated", Operator: "Exists", Effect: "NoSchedule"}}
		})
		Eventually(readyOf(ns, "tolerant"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonClassForbids),
			HaveField("Message", ContainSubstring(`spec.tolerations[0]: SandboxClass "placement-scheduling" does not allow tolerating the taint key "dedicated" (scheduling.allowedTolerations: [gpu])`))))
		Consistently(podOf(ns, "tolerant"), 2*time.Second).Should(BeNil(), "no Pod carries a toleration its class forbids")

		By("the class comes to allow it")
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(class), class); err != nil {
				return err
			}
			class.Spec.Scheduling.AllowedTolerations = []string{"gpu", "dedicated"}
			return k8s.Update(ctx, class)
		}, testharness.Timeout).Should(Succeed())
		Eventually(nodeOf(ns, "tolerant"), testharness.Timeout).ShouldNot(BeEmpty())
		pod, err := podOf(ns, "tolerant")()
		Expect(err).NotTo(HaveOccurred())
		Expect(pod.Spec.Tolerations).To(ContainElement(HaveField("Key", "dedicated")))

		By("the class narrows again: the Pod that carries the toleration goes")
		setTolerations := func(keys ...string) {
			Eventually(func() error {
				if err := k8s.Get(ctx, client.ObjectKeyFromObject(class), class); err != nil {
					return err
				}
				class.Spec.Scheduling.AllowedTolerations = keys
				return k8s.Update(ctx, class)
			}, testharness.Timeout).Should(Succeed())
		}
		setTolerations("gpu")
		Eventually(podOf(ns, "tolerant"), testharness.Timeout).Should(BeNil(), "a Pod keeps a toleration its class came to forbid")
		Eventually(readyOf(ns, "tolerant"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonClassForbids)))
		Consistently(podOf(ns, "tolerant"), 2*time.Second).Should(BeNil(), "a Pod was made again while the class forbids it")

		By("and allows it once more: a new Pod")
		setTolerations("gpu", "dedicated")
		Eventually(podOf(ns, "tolerant"), testharness.Timeout).ShouldNot(BeNil())
		Eventually(readyOf(ns, "tolerant"), testharness.Timeout).ShouldNot(HaveField("Reason", v1alpha1.ReasonClassForbids))
		carrier, err := podOf(ns, "tolerant")()
		Expect(err).NotTo(HaveOccurred())
		Expect(carrier.Spec.Tolerations).To(ContainElement(HaveField("Key", "dedicated")))

		By("the spec lets go of the toleration, which its Pod keeps, and the class narrows: that Pod goes too")
		Eventually(func() error {
			var sb v1alpha1.Sandbox
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tolerant"}, &sb); err != nil {
				return err
			}
			sb.Spec.Tolerations = nil
			return k8s.Update(ctx, &sb)
		}, testharness.Timeout).Should(Succeed())
		Consistently(func() (types.UID, error) {
			pod, err := podOf(ns, "tolerant")()
			if err != nil || pod == nil {
				return "", err
			}
			return pod.UID, nil
		}, 2*time.Second).Should(Equal(carrier.UID), "a Pod was replaced while its class allowed what it carries")
		setTolerations("gpu")
		Eventually(podOf(ns, "tolerant"), testharness.Timeout).Should(And(Not(BeNil()),
			Not(HaveField("UID", carrier.UID)), HaveField("Spec.Tolerations", Not(ContainElement(HaveField("Key", "dedicated"))))),
			"the Pod made when the spec tolerated what its class now forbids is still there")
		Eventually(readyOf(ns, "tolerant"), testharness.Timeout).ShouldNot(HaveField("Reason", v1alpha1.ReasonClassForbids))
		remove(ns, "tolerant")
	})

	It("marks the Sandboxes of a lost node NodeLost, moves those with onNodeLost: Move when their Pod is evicted, and cleans up when the node is back", func() {
		for _, name := range []string{"s2", "s3", "s4", "s5"} {
			remove(ns, name)
		}
		// On node-b, running, with a claim each: one that stays, and one
		// that may move.
		zoneB := func(sb *v1alpha1.Sandbox) { sb.Spec.NodeSelector = map[string]string{"zone": "b"} }
		sandbox(ns, "stays", zoneB)
		sandbox(ns, "mover", zoneB, func(sb *v1alpha1.Sandbox) { sb.Spec.OnNodeLost = v1alpha1.NodeLostMove })
		for _, name := range []string{"stays", "mover"} {
			Eventually(nodeOf(ns, name), testharness.Timeout).Should(Equal("node-b"))
			Expect(k8s.Create(ctx, testharness.NewClaim(ns, name+"-claim", name))).To(Succeed())
			Eventually(env.SandboxStatus(ns, name), testharness.Timeout).Should(
				testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		}
		// A second claim on the one that stays, deleted while its node is
		// lost.
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "stays-extra", "stays"))).To(Succeed())
		Eventually(env.SandboxStatus(ns, "stays"), testharness.Timeout).Should(
			testharness.SandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		nodeB.stop()
		setNodeReady("node-b", false)
		Eventually(readyOf(ns, "stays"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonNodeLost),
			HaveField("Message", And(ContainSubstring("node node-b not Ready since"), ContainSubstring("stays (onNodeLost: Stay)")))))
		Eventually(readyOf(ns, "mover"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonNodeLost),
			HaveField("Message", ContainSubstring("its Pod is evicted 2s after the node's loss"))))
		// Their claims are not left Ready on a node that is gone.
		for _, name := range []string{"stays", "mover"} {
			Eventually(claimReadyOf(ns, name+"-claim"), testharness.Timeout).Should(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonSandboxNotReady),
				HaveField("Message", And(ContainSubstring(fmt.Sprintf("Sandbox %q is not ready: NodeLost", name)), ContainSubstring("node node-b not Ready since")))))
		}
		// A claim without a worktree, deleted meanwhile, goes without
		// waiting for the node.
		Expect(k8s.Delete(ctx, testharness.NewClaim(ns, "stays-extra", "stays"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "stays-extra"}, &v1alpha1.SessionClaim{}))
		}, testharness.Timeout).Should(BeTrue(), "a deleted claim without a worktree waits for the lost node")

		// The Pods: the one that stays tolerates the loss for ever, the
		// mover's for --node-lost-after; the taint's eviction deletes it.
		stayPod, err := podOf(ns, "stays")()
		Expect(err).NotTo(HaveOccurred())
		for _, t := range stayPod.Spec.Tolerations {
			Expect(t.TolerationSeconds).To(BeNil(), "a Stay Sandbox's Pod is never evicted for its node's loss")
		}
		movePod, err := podOf(ns, "mover")()
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Delete(ctx, movePod)).To(Succeed())
		// Its selector names zone b only: the new Pod waits until the
		// selector allows another node.
		Eventually(readyOf(ns, "mover"), testharness.Timeout).Should(And(
			HaveField("Reason", v1alpha1.ReasonNodeLost),
			HaveField("Message", And(ContainSubstring("no other node can take it"), ContainSubstring("node affinity/selector")))))
		Expect(nodeOf(ns, "mover")()).To(Equal("node-b"), "a Sandbox whose new Pod is not bound stays where it was")
		dropSelector(ns, "mover")
		// The unbound Pod carries the old selector: the placer's next Pod
		// takes the new one, as any Pod's spec is fixed once made.
		pending, err := podOf(ns, "mover")()
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Delete(ctx, pending)).To(Succeed())
		Eventually(nodeOf(ns, "mover"), testharness.Timeout).Should(Equal("node-a"))
		Eventually(readyOf(ns, "mover"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", v1alpha1.ReasonRunning)),
			"its claim is served on node-a now")
		Eventually(env.ClaimStatus(ns, "mover-claim"), testharness.Timeout).Should(
			HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		Expect(readyOf(ns, "stays")()).To(HaveField("Reason", v1alpha1.ReasonNodeLost), "a Sandbox that stays waits for its node")
		Eventually(func() (string, error) {
			var events corev1.EventList
			if err := k8s.List(ctx, &events, client.InNamespace(ns), client.MatchingFields{"involvedObject.name": "mover"}); err != nil {
				return "", err
			}
			for _, e := range events.Items {
				if e.Reason == v1alpha1.ReasonNodeLost && strings.Contains(e.Message, "moved to node") {
					return e.Message, nil
				}
			}
			return "", nil
		}, testharness.Timeout).Should(ContainSubstring("node node-b not Ready since"), "a NodeLost event says why it moved")

		// node-b comes back: the one that stayed runs again there, the
		// instance of the one that moved away is removed, and its areas on
		// node-b are left alone.
		instName := v1alpha1.InstanceName(ns + "-mover")
		Expect(filepath.Join(nodeB.dir, "areas", ns+"-mover", "workspace")).To(BeADirectory())
		nodeB.start()
		setNodeReady("node-b", true)
		Eventually(env.SandboxStatus(ns, "stays"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimReadyOf(ns, "stays-claim"), testharness.Timeout).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", v1alpha1.ReasonSandboxReady)), "the node that is back serves its claim again")
		Eventually(func() (bool, error) {
			st, err := nodeB.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)
			return st.Exists, err
		}, testharness.Timeout).Should(BeFalse(), "the instance the mover left on node-b is removed")
		Expect(filepath.Join(nodeB.dir, "areas", ns+"-mover", "workspace")).To(BeADirectory(), "areas on the lost node stay")
		Expect(nodeOf(ns, "mover")()).To(Equal("node-a"))
	})

	It("stops running at once a Sandbox whose Pod was moved off a node that is alive", func() {
		remove(ns, "mover")
		sandbox(ns, "twice", func(sb *v1alpha1.Sandbox) {
			sb.Spec.NodeSelector = map[string]string{"zone": "b"}
			sb.Spec.OnNodeLost = v1alpha1.NodeLostMove
		})
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "twice-claim", "twice"))).To(Succeed())
		Eventually(nodeOf(ns, "twice"), testharness.Timeout).Should(Equal("node-b"))
		Eventually(env.SandboxStatus(ns, "twice"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		instName := v1alpha1.InstanceName(ns + "-twice")
		st, err := nodeB.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Running).To(BeTrue())

		// Its Pod goes (preempted, say) while node-b is fine, and the new
		// one may only go to zone a.
		Eventually(func() error {
			var sb v1alpha1.Sandbox
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "twice"}, &sb); err != nil {
				return err
			}
			sb.Spec.NodeSelector = map[string]string{"zone": "a"}
			return k8s.Update(ctx, &sb)
		}, testharness.Timeout).Should(Succeed())
		pod, err := podOf(ns, "twice")()
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Delete(ctx, pod, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(nodeOf(ns, "twice"), testharness.Timeout).Should(Equal("node-a"))
		moved, err := podOf(ns, "twice")()
		Expect(err).NotTo(HaveOccurred())
		Expect(moved.UID).NotTo(Equal(pod.UID))
		Eventually(podRefOf(ns, "twice"), testharness.Timeout).Should(Equal(&v1alpha1.SandboxPod{Name: moved.Name, UID: string(moved.UID)}))
		Eventually(func() (bool, error) {
			st, err := nodeB.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)
			return st.Exists, err
		}, testharness.Timeout).Should(BeFalse(), "node-b removes its instance as soon as the Sandbox is on another node, not at its next orphan collection")
		Eventually(env.SandboxStatus(ns, "twice"), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Expect(nodeA.mgr.Runtimes[v1alpha1.BackendBwrap].Inspect(ctx, instName)).To(HaveField("Running", BeTrue()), "node-a runs it now")
		Expect(readyOf(ns, "twice")()).To(HaveField("Status", metav1.ConditionTrue))
	})
})

var _ = Describe("A bwrap Sandbox with an image", func() {
	It("gets a Pod of that image running only the holder, a new image in place, and a new Pod when the image's pull settings change", func() {
		ns := env.NewNamespace()
		sandbox(ns, "py", func(sb *v1alpha1.Sandbox) {
			sb.Spec.Resources.Requests.Memory = ptr.To(resource.MustParse("8Mi"))
			sb.Spec.Bwrap = &v1alpha1.BwrapSpec{Image: "example.test/tools/python:3", ImagePullSecrets: []string{"regcred"}}
		})
		var first *corev1.Pod
		Eventually(func() (*corev1.Pod, error) {
			var err error
			first, err = podOf(ns, "py")()
			return first, err
		}, testharness.Timeout).ShouldNot(BeNil())
		spec := first.Spec
		Expect(spec.Containers).To(HaveLen(1))
		main := spec.Containers[0]
		Expect(main.Image).To(Equal("example.test/tools/python:3"))
		Expect(main.Command).To(Equal([]string{"/.sandbox-holder/sandbox-holder"}), "nothing of the image runs but the holder")
		Expect(main.VolumeMounts).To(ConsistOf(HaveField("ReadOnly", true)))
		Expect(*main.SecurityContext.RunAsNonRoot && *main.SecurityContext.ReadOnlyRootFilesystem && !*main.SecurityContext.AllowPrivilegeEscalation).To(BeTrue())
		Expect(main.Resources.Requests.Memory().String()).To(Equal("8Mi"))
		Expect(spec.InitContainers).To(HaveLen(1))
		init := spec.InitContainers[0]
		Expect(init.Image).To(Equal(holderImage))
		Expect(init.Command).To(Equal([]string{controllers.HolderPath, "install", "/.sandbox-holder"}))
		Expect(*init.SecurityContext.RunAsNonRoot && *init.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
		Expect(spec.Volumes).To(ConsistOf(HaveField("VolumeSource.EmptyDir", Not(BeNil()))))
		Expect(spec.ImagePullSecrets).To(ContainElement(corev1.LocalObjectReference{Name: "regcred"}))
		Expect(spec.AutomountServiceAccountToken).To(HaveValue(BeFalse()))

		By("a new image is set on the same Pod")
		update(ns, "py", func(sb *v1alpha1.Sandbox) { sb.Spec.Bwrap.Image = "example.test/tools/python:3.12" })
		Eventually(func() (string, error) {
			p, err := podOf(ns, "py")()
			if err != nil || p == nil {
				return "", err
			}
			if p.UID != first.UID {
				return "a new Pod " + string(p.UID), nil
			}
			return p.Spec.Containers[0].Image, nil
		}, testharness.Timeout).Should(Equal("example.test/tools/python:3.12"))

		By("a pull policy, which a Pod cannot change, gets a new Pod")
		update(ns, "py", func(sb *v1alpha1.Sandbox) { sb.Spec.Bwrap.ImagePullPolicy = "Always" })
		Eventually(func() (corev1.PullPolicy, error) {
			p, err := podOf(ns, "py")()
			if err != nil || p == nil || p.UID == first.UID {
				return "", err
			}
			return p.Spec.Containers[0].ImagePullPolicy, nil
		}, testharness.Timeout).Should(Equal(corev1.PullAlways))

		By("without the image, the Pod is the pause image's again")
		update(ns, "py", func(sb *v1alpha1.Sandbox) { sb.Spec.Bwrap = nil })
		Eventually(func() ([]corev1.Container, error) {
			p, err := podOf(ns, "py")()
			if err != nil || p == nil {
				return []corev1.Container{{}}, err
			}
			return p.Spec.InitContainers, nil
		}, testharness.Timeout).Should(BeEmpty())
	})
})

var _ = Describe("A tenant who may make Pods", func() {
	It("cannot make a Pod that places its Sandbox on a node of its choosing", func() {
		ns := env.NewNamespace()
		tenant := tenantIn(ns, "pod-maker")
		sb := sandbox(ns, "chosen", func(sb *v1alpha1.Sandbox) {
			sb.Spec.Resources.Requests.Memory = ptr.To(resource.MustParse("8Mi"))
			sb.Spec.NodeSelector = map[string]string{"zone": "a"}
		})
		Eventually(nodeOf(ns, sb.Name), testharness.Timeout).Should(Equal("node-a"))
		own, err := podOf(ns, sb.Name)()
		Expect(err).NotTo(HaveOccurred())

		// The Pod the placer would make, bound to node-b past the
		// scheduler, with the highest attempt the placer reads.
		forged := func(name string) *corev1.Pod {
			p := controllers.SandboxPod(sb, controllers.PlacementOptions{SystemNamespace: systemNS}, "node-b", 1<<20)
			p.Name = name
			return p
		}
		err = tenant.Create(ctx, forged("chosen-elsewhere"))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a tenant's Pod naming its Sandbox as controller: %v", err)
		Expect(err.Error()).To(ContainSubstring("a Pod whose controller is a Sandbox places that Sandbox on the Pod's node"))
		// Who may write where a Sandbox is placed (the aggregated API's
		// ServiceAccount, config/aggregated) may.
		placer := tenantIn(ns, "placer", rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group},
			Resources: []string{"sandboxes/status"}, Verbs: []string{"get", "update", "patch"}})
		Eventually(func() error { return placer.Create(ctx, forged("chosen-elsewhere"), client.DryRunAll) }, testharness.Timeout).Should(Succeed())
		// Nor given that controller afterwards.
		later := forged("chosen-later")
		later.OwnerReferences = nil
		Expect(tenant.Create(ctx, later)).To(Succeed())
		later.OwnerReferences = forged("").OwnerReferences
		err = tenant.Update(ctx, later)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a tenant giving its Pod the Sandbox as controller: %v", err)
		// A controller of another kind with the Sandbox's UID is not the
		// Sandbox, whatever its labels say.
		other := forged("chosen-by-uid")
		other.OwnerReferences[0].APIVersion, other.OwnerReferences[0].Kind = "example.test/v1", "Widget"
		Expect(tenant.Create(ctx, other)).To(Succeed())

		// The placer looks at the Sandbox again when it gets a claim.
		Expect(tenant.Create(ctx, testharness.NewClaim(ns, "chosen-claim", sb.Name))).To(Succeed())
		Eventually(env.SandboxStatus(ns, sb.Name), testharness.Timeout).Should(
			testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Consistently(nodeOf(ns, sb.Name), 3*time.Second).Should(Equal("node-a"))
		var kept corev1.Pod
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(own), &kept)).To(Succeed())
		Expect(kept.UID).To(Equal(own.UID))
		Expect(kept.DeletionTimestamp.IsZero()).To(BeTrue(), "the placer's own Pod stays the Sandbox's")
		Expect(podRefOf(ns, sb.Name)()).To(HaveField("UID", string(own.UID)))
		for _, p := range []*corev1.Pod{later, other} {
			Expect(k8s.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
		}
		remove(ns, sb.Name)
	})
})

// tenantIn is a user who may make Sandboxes and Pods in ns (as edit
// allows), and nothing of their status unless more says so.
func tenantIn(ns, user string, more ...rbacv1.PolicyRule) client.Client {
	GinkgoHelper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		Rules: append([]rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes", "sessionclaims"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		}, more...)}
	Expect(k8s.Create(ctx, role)).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})).To(Succeed())
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// installSandboxPodPolicy applies config/admission's policy on Pods that
// name a Sandbox as controller, and waits until the API server applies it:
// a dry-run create of such a Pod by a tenant is refused.
func installSandboxPodPolicy() {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "admission", "sandboxpod_policy.yaml"))
	Expect(err).NotTo(HaveOccurred())
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			Expect(err).To(MatchError(io.EOF))
			break
		}
		Expect(k8s.Create(ctx, u)).To(Succeed())
	}
	probe := tenantIn(systemNS, "policy-probe")
	pod := controllers.SandboxPod(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "probe", UID: "0b3c8a40-1c57-4e55-9f1e-3a6a3c6d2f10"}},
		controllers.PlacementOptions{SystemNamespace: systemNS}, "", 0)
	pod.Namespace = systemNS
	Eventually(func() bool {
		return apierrors.IsForbidden(probe.Create(ctx, pod.DeepCopy(), client.DryRunAll))
	}, testharness.Timeout).Should(BeTrue(), "the policy on Sandboxes' Pods is not applied")
}

// update changes a Sandbox's spec, retrying on a conflict.
func update(ns, name string, mutate func(*v1alpha1.Sandbox)) {
	GinkgoHelper()
	Eventually(func() error {
		var sb v1alpha1.Sandbox
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
			return err
		}
		mutate(&sb)
		return k8s.Update(ctx, &sb)
	}, testharness.Timeout).Should(Succeed())
}

var _ = Describe("The aggregated API's Deployment", func() {
	// Its ServiceAccount reads the CA keys, and a node's controller is
	// privileged: kube-scheduler puts it where no node controller runs
	// when there is such a node (here a control-plane node, whose taint
	// the DaemonSet does not tolerate).
	It("is scheduled onto a node no node controller runs on", func() {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "control-1", Labels: map[string]string{corev1.LabelHostname: "control-1"}}}
		Expect(k8s.Create(ctx, n)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, n))).To(Succeed()) })
		room := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse(nodeMemory), corev1.ResourcePods: resource.MustParse("110")}
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
				return err
			}
			n.Status = corev1.NodeStatus{Capacity: room, Allocatable: room, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
			if err := k8s.Status().Update(ctx, n); err != nil {
				return err
			}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
				return err
			}
			n.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
			return k8s.Update(ctx, n)
		}, testharness.Timeout).Should(Succeed())

		b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "aggregated", "deployment.yaml"))
		Expect(err).NotTo(HaveOccurred())
		var d appsv1.Deployment
		Expect(utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&d)).To(Succeed())
		// As the Deployment's ReplicaSet makes it, in the namespace the
		// DaemonSet's pods are in.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "sandbox-controller-api-0", Labels: d.Spec.Template.Labels}, Spec: d.Spec.Template.Spec}
		pod.Spec.ServiceAccountName = ""
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, pod, client.GracePeriodSeconds(0)))).To(Succeed())
		})
		Eventually(func() (string, error) {
			err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)
			return pod.Spec.NodeName, err
		}, testharness.Timeout).ShouldNot(BeEmpty())
		Expect(pod.Spec.NodeName).To(Equal("control-1"), "kube-scheduler put the aggregated API beside a node controller")
	})
})
