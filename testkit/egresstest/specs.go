package egresstest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// Suite is one backend's egress specs: the same Sandboxes, probe and
// expectations on every backend.
type Suite struct {
	Backend v1alpha1.Backend
	// Env is the suite's API server; its manager runs with Networks.
	Env func() *testharness.Env
	// World and Networks are the suite's (New, and the manager's).
	World    func() *World
	Networks func() *egress.Networks
	// Runtime runs commands in the suite's instances.
	Runtime func() runtimes.Runtime
	// Spec completes a Sandbox's spec for the backend (an image).
	Spec func(*v1alpha1.SandboxSpec)
	// Probe is the probe's command and its name ("python3", ProbeCommand).
	Probe    func(*World) []string
	Commands []v1alpha1.BinaryName
	// OwnNamespace: the instances keep a network namespace of their own
	// (Incus), so no file of Networks.Dir holds it.
	OwnNamespace bool
}

// ClassName is the class the specs' Sandboxes name.
const ClassName = "egress-test"

// Register adds the specs to the Ginkgo tree; it returns true, so a
// suite can register them as a package variable.
func (s Suite) Register() bool {
	return Describe("Egress on "+string(s.Backend), Ordered, func() {
		var ns string
		var k8s client.Client
		var made []*v1alpha1.Sandbox
		class := Class(ClassName, s.Backend)
		BeforeAll(func() {
			k8s = s.Env().Client
			ns = s.Env().NewNamespace()
			Expect(k8s.Create(context.Background(), class)).To(Succeed())
		})
		// The suite's other specs name no class: with a class in the
		// cluster and none marked default they would be refused, so the
		// class lives only while these specs run.
		AfterAll(func() {
			ctx := context.Background()
			objs := []client.Object{}
			for _, sb := range made {
				objs = append(objs, sb)
			}
			for _, o := range append(objs, class) {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, o))).To(Succeed())
				Eventually(func() bool {
					return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(o), o))
				}, testharness.Timeout).Should(BeTrue(), "%s should be gone", o.GetName())
			}
		})

		start := func(name string, network *v1alpha1.Network) *v1alpha1.Sandbox {
			ctx := context.Background()
			sb := &v1alpha1.Sandbox{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: v1alpha1.SandboxSpec{Agent: ns + "-" + name, Backend: s.Backend, ClassName: ClassName,
					Network: network, Binaries: append([]v1alpha1.BinaryName{"env"}, s.Commands...)},
			}
			if s.Spec != nil {
				s.Spec(&sb.Spec)
			}
			ExpectWithOffset(1, k8s.Create(ctx, sb)).To(Succeed())
			made = append(made, sb)
			ExpectWithOffset(1, k8s.Create(ctx, testharness.NewClaim(ns, name+"-claim", name))).To(Succeed())
			EventuallyWithOffset(1, s.Env().SandboxStatus(ns, name), testharness.Timeout).
				Should(testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
			return sb
		}
		run := func(sb *v1alpha1.Sandbox, argv ...string) string {
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			code, err := s.Runtime().Exec(ctx, v1alpha1.InstanceName(sb.Spec.Agent), runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errOut})
			ExpectWithOffset(1, err).NotTo(HaveOccurred())
			ExpectWithOffset(1, code.Code).To(BeZero(), "stderr: %s", errOut.String())
			return out.String()
		}

		It("reaches exactly the listed hosts through the proxy, and nothing else", func() {
			sb := start("allow", s.World().Allowlist())
			Expect(run(sb, "env")).To(ContainSubstring("HTTPS_PROXY=" + egress.ProxyURL))
			out := run(sb, s.Probe(s.World())...)
			Expect(Check(out, v1alpha1.EgressAllowlist)).To(BeEmpty(), "the probe said:\n%s", out)

			By("the denials are Events of the Sandbox naming the host")
			Eventually(func() string {
				var evs corev1.EventList
				Expect(k8s.List(context.Background(), &evs, client.InNamespace(ns))).To(Succeed())
				var b strings.Builder
				for _, e := range evs.Items {
					if e.Reason == v1alpha1.ReasonEgressDenied && e.InvolvedObject.Name == sb.Name {
						b.WriteString(e.Message + "\n")
					}
				}
				return b.String()
			}, testharness.Timeout).Should(ContainSubstring(`egress to "` + Unlisted))

			By("the namespace and the proxy go with the Sandbox")
			path := filepath.Join(s.Networks().Dir, v1alpha1.InstanceName(sb.Spec.Agent))
			if !s.OwnNamespace {
				Expect(path).To(BeAnExistingFile())
			}
			s.Env().DeleteAndWait(sb)
			_, err := os.Lstat(path)
			Expect(os.IsNotExist(err)).To(BeTrue(), "%s after the Sandbox was deleted: %v", path, err)
		})

		It("reaches nothing with egress None", func() {
			sb := start("none", nil)
			Expect(run(sb, "env")).NotTo(ContainSubstring("PROXY"))
			out := run(sb, s.Probe(s.World())...)
			Expect(Check(out, v1alpha1.EgressNone)).To(BeEmpty(), "the probe said:\n%s", out)
		})
	})
}

// PythonProbe is the python3 probe's command.
func PythonProbe(w *World) []string { return w.ProbeArgs() }

// StaticProbe is the static probe's command.
func StaticProbe(w *World) []string { return w.StaticProbeArgs() }
