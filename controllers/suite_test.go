package controllers_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/testenv"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

var (
	env       *envtest.Environment
	cfg       *rest.Config
	k8s       client.Client
	scheme    = runtime.NewScheme()
	areasRoot string
	stateDir  string
	mgr       *managerRun
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(GinkgoT(), "envtest binaries", p)
	}
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (hack/install-deps.sh)")

	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	env = &envtest.Environment{CRDDirectoryPaths: []string{testenv.CRDDir(1)}, ErrorIfCRDPathMissing: true}
	var err error
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	tmp, err := os.MkdirTemp("", "sandbox-controllers-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, tmp)
	areasRoot = filepath.Join(tmp, "areas")
	stateDir = filepath.Join(tmp, "state")
	mgr = startManager()
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.stop()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// managerRun is one running manager with its recorded runtime.
type managerRun struct {
	rt     *recordingRuntime
	cancel context.CancelFunc
	done   chan struct{}
}

// startManager runs the controllers with a real bwrap driver over the
// suite's state directory, so a second start sees what the first left.
func startManager() *managerRun {
	drv, err := bwrap.New(bwrap.Config{StateDir: stateDir})
	Expect(err).NotTo(HaveOccurred())
	rt := &recordingRuntime{Runtime: drv}
	m, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	Expect(controllers.Setup(ctx, m, controllers.Options{
		Runtimes: map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: rt},
		Host:     runtimes.Options{AreasRoot: areasRoot, Home: "/nonexistent-home"},
	})).To(Succeed())
	run := &managerRun{rt: rt, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(run.done)
		Expect(m.Start(ctx)).To(Succeed())
	}()
	return run
}

func (m *managerRun) stop() {
	m.cancel()
	Eventually(m.done, 30*time.Second).Should(BeClosed())
}

// call is one recorded runtime call.
type call struct {
	op, name string
	at       time.Time
}

// recordingRuntime passes every call to the real driver and records it, so
// tests can say exactly how the controller used the runtime.
type recordingRuntime struct {
	runtimes.Runtime
	mu    sync.Mutex
	calls []call
}

func (r *recordingRuntime) record(op, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{op: op, name: name, at: time.Now()})
}

func (r *recordingRuntime) Ensure(ctx context.Context, in runtimes.Instance) (runtimes.State, error) {
	r.record("Ensure", in.Name)
	return r.Runtime.Ensure(ctx, in)
}

func (r *recordingRuntime) Stop(ctx context.Context, name string) error {
	r.record("Stop", name)
	return r.Runtime.Stop(ctx, name)
}

func (r *recordingRuntime) Delete(ctx context.Context, name string) error {
	r.record("Delete", name)
	return r.Runtime.Delete(ctx, name)
}

func (r *recordingRuntime) Inspect(ctx context.Context, name string) (runtimes.State, error) {
	r.record("Inspect", name)
	return r.Runtime.Inspect(ctx, name)
}

// count is how many times op was called for the instance.
func (r *recordingRuntime) count(op, name string) int {
	return len(r.times(op, name))
}

func (r *recordingRuntime) times(op, name string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Time
	for _, c := range r.calls {
		if c.op == op && c.name == name {
			out = append(out, c.at)
		}
	}
	return out
}
