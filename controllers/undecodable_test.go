package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// idleTimeoutSchema is the path of spec.idleTimeout's schema in the CRD.
var idleTimeoutSchema = []string{"schema", "openAPIV3Schema", "properties", "spec", "properties", "idleTimeout"}

// withIdleTimeoutSchema changes the schema of spec.idleTimeout in the
// installed Sandbox CRD and returns the schema it had.
func withIdleTimeoutSchema(change func(map[string]any)) map[string]any {
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(crdGVK)
	Expect(k8s.Get(ctx, client.ObjectKey{Name: "sandboxes." + v1alpha1.GroupVersion.Group}, crd)).To(Succeed())
	versions, _, err := unstructured.NestedSlice(crd.Object, "spec", "versions")
	Expect(err).NotTo(HaveOccurred())
	Expect(versions).To(HaveLen(1))
	v := versions[0].(map[string]any)
	old, found, err := unstructured.NestedMap(v, idleTimeoutSchema...)
	Expect(err).NotTo(HaveOccurred())
	Expect(found).To(BeTrue())
	s := runtime.DeepCopyJSONValue(old).(map[string]any)
	change(s)
	Expect(unstructured.SetNestedMap(v, s, idleTimeoutSchema...)).To(Succeed())
	Expect(unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions")).To(Succeed())
	Expect(k8s.Update(ctx, crd)).To(Succeed())
	return old
}

var _ = Describe("A Sandbox the controller cannot decode", Ordered, func() {
	var restore map[string]any

	BeforeAll(func() {
		By("installing the Sandbox CRD without the rules of spec.idleTimeout, as an old or hand-edited copy would be")
		restore = withIdleTimeoutSchema(func(s map[string]any) { delete(s, "x-kubernetes-validations") })
		DeferCleanup(func() {
			withIdleTimeoutSchema(func(s map[string]any) {
				for k := range s {
					delete(s, k)
				}
				for k, v := range restore {
					s[k] = v
				}
			})
		})
	})

	It("is reported (InvalidSpec and an Event), kept as written, and stalls no other Sandbox or claim, before or after a restart", func() {
		ns := newNamespace()
		bad := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Sandbox",
			"metadata": map[string]any{"name": "banana", "namespace": ns},
			"spec":     map[string]any{"agent": "banana", "idleTimeout": "banana"},
		}}
		// The API server takes a moment to use the changed schema.
		Eventually(func() error { return k8s.Create(ctx, bad.DeepCopy()) }, timeout).Should(Succeed())

		By("the bad Sandbox is reported, with the field and the rule")
		Eventually(sandboxStatus(ns, "banana"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec)))
		st, err := sandboxStatus(ns, "banana")()
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Conditions).To(ContainElement(HaveField("Message",
			ContainSubstring(`spec.idleTimeout: Invalid value: "banana": `+v1alpha1.MsgIdleTimeoutFormat))))
		Eventually(func() ([]string, error) {
			var evs corev1.EventList
			err := k8s.List(ctx, &evs, client.InNamespace(ns))
			var msgs []string
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == "banana" && e.Reason == v1alpha1.ReasonInvalidSpec && e.Type == corev1.EventTypeWarning {
					msgs = append(msgs, e.Message)
				}
			}
			return msgs, err
		}, timeout).Should(ContainElement(ContainSubstring(v1alpha1.MsgIdleTimeoutFormat)))

		By("the controller's finalizer update wrote the user's value back unchanged")
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Sandbox"))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "banana"}, got)).To(Succeed())
		Expect(got.GetFinalizers()).To(ContainElement(v1alpha1.Finalizer))
		idle, _, _ := unstructured.NestedString(got.Object, "spec", "idleTimeout")
		Expect(idle).To(Equal("banana"))

		By("another Sandbox and its claim still reconcile")
		Expect(k8s.Create(ctx, newSandbox(ns, "good", "good-beside-banana", time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c1", "good"))).To(Succeed())
		Eventually(claimStatus(ns, "c1"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))

		By("a restarted controller, whose first list holds the bad Sandbox, reconciles the others")
		mgr.stop()
		mgr = startManager()
		Expect(k8s.Create(ctx, newClaim(ns, "c2", "good"))).To(Succeed())
		Eventually(sandboxStatus(ns, "good"), timeout).Should(sandboxIs(2, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		Eventually(claimStatus(ns, "c2"), timeout).Should(HaveField("Conditions",
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))

		By("a claim on the bad Sandbox says why it is not Ready")
		Expect(k8s.Create(ctx, newClaim(ns, "on-banana", "banana"))).To(Succeed())
		Eventually(claimStatus(ns, "on-banana"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSandboxNotReady),
			ContainElement(HaveField("Message", ContainSubstring(v1alpha1.ReasonInvalidSpec))))))

		By("the bad Sandbox can be deleted: its finalizer is released")
		deleteAndWait(newClaim(ns, "on-banana", "banana"))
		Expect(k8s.Delete(ctx, got)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "banana"}, got))
		}, timeout).Should(BeTrue())
		deleteAndWait(newClaim(ns, "c1", "good"))
		deleteAndWait(newClaim(ns, "c2", "good"))
	})
})
