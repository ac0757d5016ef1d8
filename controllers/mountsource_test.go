package controllers_test

import (
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

var _ = Describe("Mount sources", func() {
	// A source a bind cannot use leaves the Sandbox and its claims not
	// Ready, saying which mount and why; once the source is a directory
	// again, Ready comes back without anyone touching the objects.
	DescribeTable("a Sandbox whose mount source cannot be bound is MountSourceMissing until it can",
		func(agent string, plant func(src string), problem string) {
			ns := newNamespace()
			src := filepath.Join(env.Dir, "mount-sources", agent)
			Expect(os.MkdirAll(filepath.Dir(src), 0o755)).To(Succeed())
			plant(src)
			sb := newSandbox(ns, agent, agent, time.Minute)
			sb.Spec.Mounts = []v1alpha1.Mount{{Source: src, Target: "data"}}
			Expect(k8s.Create(ctx, sb)).To(Succeed())
			Expect(k8s.Create(ctx, newClaim(ns, "c", agent))).To(Succeed())
			inst := v1alpha1.InstanceName(agent)

			By("the Sandbox says which mount, which path and what is wrong")
			Eventually(sandboxStatus(ns, agent), timeout).Should(And(
				sandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonMountSourceMissing),
				HaveField("Conditions", haveCondition(v1alpha1.ConditionRuntimeReady, metav1.ConditionFalse, v1alpha1.ReasonMountSourceMissing)),
			))
			st, err := sandboxStatus(ns, agent)()
			Expect(err).NotTo(HaveOccurred())
			Expect(findReady(st.Conditions).Message).To(And(
				ContainSubstring("mount /workspace/data"), ContainSubstring(src), ContainSubstring(problem)))
			Expect(mgr.rt.Count("Ensure", inst)).To(Equal(0), "nothing is started from a spec whose mounts cannot be bound")

			By("the claim is not Ready")
			Eventually(claimStatus(ns, "c"), timeout).Should(
				HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSandboxNotReady)))

			By("the source comes back as a directory: Ready returns and a command runs")
			Expect(os.RemoveAll(src)).To(Succeed())
			Expect(os.Mkdir(src, 0o755)).To(Succeed())
			Eventually(sandboxStatus(ns, agent), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
			Eventually(claimStatus(ns, "c"), timeout).Should(
				HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
			exit, err := mgr.rt.Exec(ctx, inst, runtimes.ExecRequest{Argv: []string{"sh", "-c", "test -d /workspace/data"}})
			Expect(err).NotTo(HaveOccurred())
			Expect(exit.Code).To(Equal(0))

			By("the source goes while the Sandbox is Ready: it is not Ready again")
			Expect(os.Remove(src)).To(Succeed())
			Eventually(sandboxStatus(ns, agent), timeout).Should(sandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonMountSourceMissing))
			Eventually(claimStatus(ns, "c"), timeout).Should(
				HaveField("Conditions", haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSandboxNotReady)))
			Expect(os.Mkdir(src, 0o755)).To(Succeed())
			Eventually(sandboxStatus(ns, agent), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		},
		Entry("missing source", "mount-missing", func(string) {}, "does not exist"),
		Entry("source is a file", "mount-file", func(src string) {
			Expect(os.WriteFile(src, []byte("not a directory"), 0o644)).To(Succeed())
		}, "is not a directory (it is a regular file)"),
		Entry("source is a symlink loop", "mount-loop", func(src string) {
			Expect(os.Symlink(src, src)).To(Succeed())
		}, "symbolic link loop"),
	)
})

func findReady(conds []metav1.Condition) metav1.Condition {
	for _, c := range conds {
		if c.Type == v1alpha1.ConditionReady {
			return c
		}
	}
	return metav1.Condition{}
}
