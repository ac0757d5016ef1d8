// Package egress_test holds network egress end to end on the bwrap
// backend (egresstest.Suite, which the containerd and Incus suites run
// too): a real kube-apiserver, the controller with real bubblewrap and
// real network namespaces, the test's own servers (no traffic leaves the
// machine).
package egress_test

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

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
	mgr      *testharness.Manager
	drv      *bwrap.Runtime
	world    *egresstest.World
	networks *egress.Networks
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
	// Commands start as the controller starts them: through the starter,
	// forked inside the Sandbox's network namespace.
	drv, err = bwrap.New(bwrap.Config{StateDir: filepath.Join(env.Dir, "state"), Starter: testenv.Starter(GinkgoT())})
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

var _ = egresstest.Suite{
	Backend:  v1alpha1.BackendBwrap,
	Env:      func() *testharness.Env { return env },
	World:    func() *egresstest.World { return world },
	Networks: func() *egress.Networks { return networks },
	Runtime:  func() runtimes.Runtime { return drv },
	Probe:    egresstest.PythonProbe,
	Commands: []v1alpha1.BinaryName{"python3"},
}.Register()
