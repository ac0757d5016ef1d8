// Package egress_test holds network egress end to end on the bwrap
// backend: a real kube-apiserver, the controller with real bubblewrap and
// real network namespaces, a Sandbox with an allowlist reaching exactly
// its hosts through its proxy, one with egress None reaching nothing.
// The servers are the test's own (egresstest): no traffic leaves the
// machine. Classes are cluster-scoped, so this suite has its own API
// server.
package egress_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

var (
	env      *testharness.Env
	k8s      client.Client
	mgr      *testharness.Manager
	drv      *bwrap.Runtime
	world    *egresstest.World
	networks *egress.Networks
	ctx      = context.Background()
)

func TestEgress(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Egress suite (bwrap)")
}

var _ = BeforeSuite(func() {
	if os.Geteuid() != 0 {
		testenv.Missing(GinkgoT(), "root", "network namespaces need root: run the tests as root (CI does)")
	}
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (hack/install-deps.sh)")
	testenv.Binary(GinkgoT(), "python3", "install python3 (hack/install-deps.sh)")
	var err error
	world, err = egresstest.New()
	Expect(err).NotTo(HaveOccurred())
	env = testharness.Start()
	k8s = env.Client
	Expect(k8s.Create(ctx, egresstest.Class("egress-test", v1alpha1.BackendBwrap))).To(Succeed())
	drv, err = bwrap.New(bwrap.Config{StateDir: filepath.Join(env.Dir, "state")})
	Expect(err).NotTo(HaveOccurred())
	networks = &egress.Networks{Dir: filepath.Join(env.Dir, "state", "netns"), Resolver: world.Resolver()}
	mgr = env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{Networks: networks})
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.Stop()
	}
	if networks != nil {
		networks.Close()
	}
	if env != nil {
		Expect(bwrap.DetachTrees(filepath.Join(env.Dir, "state"))).To(Succeed())
	}
	env.Stop()
	if world != nil {
		world.Close()
	}
})

func sandbox(ns, name string, network *v1alpha1.Network) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.SandboxSpec{Agent: ns + "-" + name, Network: network, ClassName: "egress-test",
			Binaries: []v1alpha1.BinaryName{"python3", "env"}},
	}
}

// start creates sb and a claim on it, and waits until it runs.
func start(sb *v1alpha1.Sandbox) {
	ExpectWithOffset(1, k8s.Create(ctx, sb)).To(Succeed())
	ExpectWithOffset(1, k8s.Create(ctx, testharness.NewClaim(sb.Namespace, sb.Name+"-claim", sb.Name))).To(Succeed())
	EventuallyWithOffset(1, env.SandboxStatus(sb.Namespace, sb.Name), testharness.Timeout).Should(testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
}

// run runs argv in sb's instance and returns its output.
func run(sb *v1alpha1.Sandbox, argv ...string) string {
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	code, err := drv.Exec(ctx, v1alpha1.InstanceName(sb.Spec.Agent), runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errOut})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, code.Code).To(BeZero(), "stderr: %s", errOut.String())
	return out.String()
}

var _ = Describe("Egress on bwrap", Ordered, func() {
	var ns string
	BeforeAll(func() { ns = env.NewNamespace() })

	It("reaches exactly the listed hosts through the proxy, and nothing else", func() {
		sb := sandbox(ns, "allow", world.Allowlist())
		start(sb)
		Expect(run(sb, "env")).To(ContainSubstring("HTTPS_PROXY=" + egress.ProxyURL))
		out := run(sb, world.ProbeArgs()...)
		Expect(egresstest.Check(out, v1alpha1.EgressAllowlist)).To(BeEmpty(), "the probe said:\n%s", out)

		By("the denials are Events of the Sandbox naming the host")
		Eventually(func() string {
			var evs corev1.EventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var b strings.Builder
			for _, e := range evs.Items {
				if e.Reason == v1alpha1.ReasonEgressDenied && e.InvolvedObject.Name == sb.Name {
					b.WriteString(e.Message + "\n")
				}
			}
			return b.String()
		}, testharness.Timeout).Should(ContainSubstring(`egress to "example.org`))
	})

	It("reaches nothing with egress None", func() {
		sb := sandbox(ns, "none", nil)
		start(sb)
		Expect(run(sb, "env")).NotTo(ContainSubstring("PROXY"))
		out := run(sb, world.ProbeArgs()...)
		Expect(egresstest.Check(out, v1alpha1.EgressNone)).To(BeEmpty(), "the probe said:\n%s", out)
	})

	It("removes the network namespace with the Sandbox", func() {
		sb := sandbox(ns, "gone", world.Allowlist())
		start(sb)
		path := filepath.Join(networks.Dir, v1alpha1.InstanceName(sb.Spec.Agent))
		Expect(path).To(BeAnExistingFile())
		env.DeleteAndWait(sb)
		Expect(path).NotTo(BeAnExistingFile())
	})
})
