package controllers_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

var (
	env       *testharness.Env
	k8s       client.Client
	areasRoot string
	mgr       *managerRun
	ctx       = context.Background()
	// controllerEnv is the controller's environment as its Getenv sees it.
	controllerEnv sync.Map
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers suite")
}

var _ = BeforeSuite(func() {
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (hack/install-deps.sh)")
	env = testharness.Start()
	k8s = env.Client
	areasRoot = env.AreasRoot
	mgr = startManager()
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.stop()
	}
	if env != nil {
		Expect(bwrap.DetachTrees(filepath.Join(env.Dir, "state"))).To(Succeed())
	}
	env.Stop()
})

// managerRun is one running manager and the recorder around its bwrap driver.
type managerRun struct {
	*testharness.Manager
	rt *testharness.Recorder
}

func (m *managerRun) stop() { m.Stop() }

// startManager runs the controllers with a real bwrap driver over the
// suite's state directory, so a second start sees what the first left.
func startManager() *managerRun {
	// Commands start as the controller starts them: through the starter
	// beside its binary.
	drv, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(env.Dir, "state"), Starter: testenv.Starter(GinkgoT())})
	Expect(err).NotTo(HaveOccurred())
	m := env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{
		HealthInterval: time.Second,
		Getenv: func(k string) string {
			v, _ := controllerEnv.Load(k)
			s, _ := v.(string)
			return s
		},
	})
	return &managerRun{Manager: m, rt: m.Runtimes[v1alpha1.BackendBwrap]}
}
