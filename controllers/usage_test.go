package controllers_test

import (
	"bytes"
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

var _ = Describe("Sandbox usage", func() {
	// A user whose command died at a limit learns why: an Event names the
	// limit, and the usage is in the controller's metrics; meanwhile
	// another Sandbox's claims become Ready and its commands run.
	It("reports a command killed at its memory limit or refused at its pids limit, and serves the others meanwhile", func() {
		testenv.Binary(GinkgoT(), "python3", "install python3")
		ns := newNamespace()
		sb := newSandbox(ns, "hog", "hog", time.Minute)
		sb.Spec.Binaries = []v1alpha1.BinaryName{"python3"}
		sb.Spec.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](32),
			Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("96Mi"))}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c", "hog"))).To(Succeed())
		Eventually(sandboxStatus(ns, "hog"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		hog := func(script string) {
			var out bytes.Buffer
			_, err := mgr.rt.Exec(context.Background(), v1alpha1.InstanceName("hog"), runtimes.ExecRequest{
				Argv: []string{"python3", "-c", script}, Stdout: &out, Stderr: &out})
			Expect(err).NotTo(HaveOccurred(), out.String())
		}
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			hog("b = bytearray()\nwhile True:\n    b += b'x' * (1 << 20)\n")
			hog("import os, time\nfor i in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\nos.killpg(0, 9)\n")
		}()

		By("another Sandbox becomes Ready and runs commands while the first hits its limits")
		other := newSandbox(ns, "calm", "calm", time.Minute)
		Expect(k8s.Create(ctx, other)).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "c2", "calm"))).To(Succeed())
		Eventually(sandboxStatus(ns, "calm"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		st, err := mgr.rt.Exec(context.Background(), v1alpha1.InstanceName("calm"), runtimes.ExecRequest{Argv: []string{"true"}})
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Code).To(Equal(0))
		<-done

		By("an Event names each limit")
		Eventually(func() ([]string, error) {
			var evs corev1.EventList
			err := k8s.List(ctx, &evs, client.InNamespace(ns))
			var reasons []string
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == "hog" {
					reasons = append(reasons, e.Reason)
				}
			}
			return reasons, err
		}, timeout).Should(ContainElements(controllers.EventOOMKilled, controllers.EventPidsLimitReached))

		By("the status says it, in a condition and in status.usage (kubectl get sandbox -o wide)")
		Eventually(func() (*metav1.Condition, error) {
			var got v1alpha1.Sandbox
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hog"}, &got)
			return meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionWithinLimits), err
		}, timeout).Should(And(Not(BeNil()), HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonOOMKilled)))
		var hogNow v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hog"}, &hogNow)).To(Succeed())
		Expect(hogNow.Status.Usage).NotTo(BeNil())
		Expect(hogNow.Status.Usage.OOMKills).To(BeNumerically(">=", 1))
		Expect(hogNow.Status.Usage.PidsLimitRefusals).To(BeNumerically(">=", 1))
		Expect(hogNow.Status.Usage.Memory).NotTo(BeNil())
		var calmNow v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "calm"}, &calmNow)).To(Succeed())
		Expect(meta.FindStatusCondition(calmNow.Status.Conditions, v1alpha1.ConditionWithinLimits)).To(
			And(Not(BeNil()), HaveField("Reason", v1alpha1.ReasonWithinLimits)))

		By("the metrics say what it used")
		values := usageMetricsOf(ns, "hog")
		Expect(values).To(HaveKey("sandbox_memory_bytes"))
		Expect(values).To(HaveKey("sandbox_processes"))
		Expect(values["sandbox_oom_kills_total"]).To(BeNumerically(">=", 1))
		Expect(values["sandbox_pids_limit_refusals_total"]).To(BeNumerically(">=", 1))
		Expect(values["sandbox_cpu_seconds_total"]).To(BeNumerically(">", 0))
	})
})

// usageMetricsOf are the per-Sandbox metrics of ns/name the controller's
// registry gives now, by name.
func usageMetricsOf(ns, name string) map[string]float64 {
	GinkgoHelper()
	families, err := crmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	values := map[string]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "sandbox_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			if strings.Join(labels, "/") != ns+"/"+name {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				values[f.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				values[f.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	return values
}
