//go:build e2e

package containerd_test

import (
	"bytes"
	"context"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// egressClass is the class the egress specs' Sandboxes name.
const egressClass = "egress-test"

var _ = Describe("Egress on containerd", Ordered, func() {
	var ns string
	BeforeAll(func() {
		ns = env.NewNamespace()
		Expect(k8s.Create(ctx, egresstest.Class(egressClass, v1alpha1.BackendContainerd))).To(Succeed())
	})

	egressSandbox := func(name string, network *v1alpha1.Network) *v1alpha1.Sandbox {
		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.SandboxSpec{Agent: ns + "-" + name, Backend: v1alpha1.BackendContainerd, ClassName: egressClass,
				Network: network, Binaries: []v1alpha1.BinaryName{egresstest.ProbeCommand, "env"},
				Containerd: &v1alpha1.ContainerdSpec{Image: image}},
		}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, name+"-claim", name))).To(Succeed())
		Eventually(env.SandboxStatus(ns, name), testharness.Timeout).Should(testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		return sb
	}
	run := func(sb *v1alpha1.Sandbox, argv ...string) string {
		var out, errOut bytes.Buffer
		c, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		code, err := drv.Exec(c, v1alpha1.InstanceName(sb.Spec.Agent), runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errOut})
		ExpectWithOffset(1, err).NotTo(HaveOccurred())
		ExpectWithOffset(1, code.Code).To(BeZero(), "stderr: %s", errOut.String())
		return out.String()
	}

	It("reaches exactly the listed hosts through the proxy, and nothing else", func() {
		sb := egressSandbox("allow", world.Allowlist())
		Expect(run(sb, "env")).To(ContainSubstring("HTTPS_PROXY=" + egress.ProxyURL))
		out := run(sb, world.StaticProbeArgs()...)
		Expect(egresstest.Check(out, v1alpha1.EgressAllowlist)).To(BeEmpty(), "the probe said:\n%s", out)
		By("the container's network is the Sandbox's namespace, which goes with it")
		path := filepath.Join(networks.Dir, v1alpha1.InstanceName(sb.Spec.Agent))
		Expect(path).To(BeAnExistingFile())
		env.DeleteAndWait(sb)
		Expect(path).NotTo(BeAnExistingFile())
	})

	It("reaches nothing with egress None", func() {
		sb := egressSandbox("none", nil)
		Expect(run(sb, "env")).NotTo(ContainSubstring("PROXY"))
		out := run(sb, world.StaticProbeArgs()...)
		Expect(egresstest.Check(out, v1alpha1.EgressNone)).To(BeEmpty(), "the probe said:\n%s", out)
	})
})
