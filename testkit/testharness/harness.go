// Package testharness is the shared harness of the envtest suites: a real
// kube-apiserver and etcd with the project's CRDs, the controllers started
// in a goroutine over real runtime drivers, a recorder around each driver,
// and matchers that read status through a direct client (never the
// manager's cache). It is test code: nothing outside *_test.go imports it.
package testharness

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// Timeout bounds every Eventually of the suites.
const Timeout = 60 * time.Second

// Env is one running API server with the CRDs installed.
type Env struct {
	env    *envtest.Environment
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme
	// AreasRoot is a fresh areas root for the suite.
	AreasRoot string
	// Dir is a fresh scratch directory for the suite (state, images, repos).
	Dir string

	watchOnce sync.Once
	watcher   client.WithWatch
}

// Start starts the API server; call it in BeforeSuite. A missing envtest
// binary fails under CI=true and skips elsewhere.
func Start() *Env {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(GinkgoT(), "envtest binaries", p)
	}
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	e := &Env{Scheme: scheme}
	e.env = &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(repoRoot(), "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	var err error
	e.Config, err = localcp.StartEnvironment(e.env)
	Expect(err).NotTo(HaveOccurred())
	e.Client, err = client.New(e.Config, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	e.Dir, err = os.MkdirTemp("", "sandbox-e2e-")
	Expect(err).NotTo(HaveOccurred())
	e.AreasRoot = filepath.Join(e.Dir, "areas")
	return e
}

// Stop stops the API server and removes the scratch directory; call it in AfterSuite.
func (e *Env) Stop() {
	if e == nil {
		return
	}
	if e.env != nil {
		Expect(e.env.Stop()).To(Succeed())
	}
	if e.Dir != "" {
		// A sized layer a failed spec left mounted would make RemoveAll
		// fail (busy) or reach into it: unmount what is below first.
		unmountBelow(e.Dir)
		Expect(os.RemoveAll(e.Dir)).To(Succeed())
	}
}

// unmountBelow detaches every mount below dir, deepest first.
func unmountBelow(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, p := range points {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

func repoRoot() string {
	dir, err := os.Getwd()
	Expect(err).NotTo(HaveOccurred())
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		Expect(parent).NotTo(Equal(dir), "no go.mod above the test directory")
		dir = parent
	}
}

// Manager is one running controller manager and the recorders around its drivers.
type Manager struct {
	Runtimes map[v1alpha1.Backend]*Recorder
	// Client is the manager's client, reading through its cache as the
	// controller's own exec API does.
	Client client.Client
	// Writes counts what the manager's client changed, by object.
	Writes *Writes
	cancel context.CancelFunc
	done   chan struct{}
}

// StartManager runs the controllers over the given drivers, each wrapped in
// a Recorder. opts.Runtimes and opts.Host are filled in.
func (e *Env) StartManager(drivers map[v1alpha1.Backend]runtimes.Runtime, opts controllers.Options) *Manager {
	writes := &Writes{}
	m := e.newManager(cache.Options{NewInformer: controllers.NewInformerFor(e.Config)}, writes)
	run := &Manager{Runtimes: map[v1alpha1.Backend]*Recorder{}, Client: m.GetClient(), Writes: writes, done: make(chan struct{})}
	opts.Runtimes = map[v1alpha1.Backend]runtimes.Runtime{}
	for b, d := range drivers {
		rec := &Recorder{Runtime: d}
		run.Runtimes[b] = rec
		opts.Runtimes[b] = rec
	}
	if opts.Host.AreasRoot == "" {
		opts.Host = instance.Host{AreasRoot: e.AreasRoot, Home: "/nonexistent-home"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	run.cancel = cancel
	Expect(controllers.Setup(ctx, m, opts)).To(Succeed())
	run.start(ctx, m)
	return run
}

// newManager is a manager on the suite's API server with the cache c,
// its writes counted in writes (when not nil).
func (e *Env) newManager(c cache.Options, writes *Writes) ctrl.Manager {
	cfg := rest.CopyConfig(e.Config)
	if writes != nil {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, writes: writes} })
	}
	m, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  e.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   c,
		// Suites restart the manager in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	return m
}

// start runs mgr until ctx ends; Stop waits for it.
func (m *Manager) start(ctx context.Context, mgr ctrl.Manager) {
	go func() {
		defer GinkgoRecover()
		defer close(m.done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
}

// Stop stops the manager and waits until it has returned.
func (m *Manager) Stop() {
	m.cancel()
	Eventually(m.done, Timeout).Should(BeClosed())
}

// Call is one recorded driver call.
type Call struct {
	Op, Name string
	At       time.Time
}

// Recorder passes every call to the real driver and records it, so a test
// can say exactly how the controller used the runtime.
type Recorder struct {
	runtimes.Runtime
	mu    sync.Mutex
	calls []Call
}

func (r *Recorder) record(op, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, Call{Op: op, Name: name, At: time.Now()})
}

func (r *Recorder) Ensure(ctx context.Context, in runtimes.Instance) (runtimes.State, error) {
	r.record("Ensure", in.Name)
	return r.Runtime.Ensure(ctx, in)
}

func (r *Recorder) Stop(ctx context.Context, name string) error {
	r.record("Stop", name)
	return r.Runtime.Stop(ctx, name)
}

func (r *Recorder) Delete(ctx context.Context, name string) error {
	r.record("Delete", name)
	return r.Runtime.Delete(ctx, name)
}

func (r *Recorder) Inspect(ctx context.Context, name string) (runtimes.State, error) {
	r.record("Inspect", name)
	return r.Runtime.Inspect(ctx, name)
}

// Count is how many times op was called for the instance.
func (r *Recorder) Count(op, name string) int { return len(r.Times(op, name)) }

// Times are the moments op was called for the instance.
func (r *Recorder) Times(op, name string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Time
	for _, c := range r.calls {
		if c.Op == op && c.Name == name {
			out = append(out, c.At)
		}
	}
	return out
}

// NewNamespace creates a namespace with a generated name.
func (e *Env) NewNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	Expect(e.Client.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

// SandboxStatus reads a Sandbox's status straight from the API server.
func (e *Env) SandboxStatus(ns, name string) func() (v1alpha1.SandboxStatus, error) {
	return func() (v1alpha1.SandboxStatus, error) {
		var sb v1alpha1.Sandbox
		err := e.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &sb)
		return sb.Status, err
	}
}

// ClaimStatus reads a SessionClaim's status straight from the API server.
func (e *Env) ClaimStatus(ns, name string) func() (v1alpha1.SessionClaimStatus, error) {
	return func() (v1alpha1.SessionClaimStatus, error) {
		var c v1alpha1.SessionClaim
		err := e.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &c)
		return c.Status, err
	}
}

// DeleteAndWait deletes obj and waits until the API server no longer has it.
func (e *Env) DeleteAndWait(obj client.Object) {
	ctx := context.Background()
	Expect(e.Client.Delete(ctx, obj)).To(Succeed())
	Eventually(func() bool {
		return apierrors.IsNotFound(e.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}, Timeout).Should(BeTrue(), "%s should be gone", obj.GetName())
}

// HaveCondition matches a condition list whose condition typ has that status and reason.
func HaveCondition(typ string, status metav1.ConditionStatus, reason string) OmegaMatcher {
	return WithTransform(func(conds []metav1.Condition) string {
		c := meta.FindStatusCondition(conds, typ)
		if c == nil {
			return "absent"
		}
		return fmt.Sprintf("%s/%s", c.Status, c.Reason)
	}, Equal(fmt.Sprintf("%s/%s", status, reason)))
}

// SandboxIs matches a Sandbox status by claim count and Ready condition.
func SandboxIs(claims int32, status metav1.ConditionStatus, reason string) OmegaMatcher {
	return And(
		HaveField("Claims", claims),
		HaveField("Conditions", HaveCondition(v1alpha1.ConditionReady, status, reason)),
	)
}

// NewClaim is a SessionClaim for a Sandbox.
func NewClaim(ns, name, sandbox string) *v1alpha1.SessionClaim {
	return &v1alpha1.SessionClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.SessionClaimSpec{SandboxName: sandbox, Session: "session-" + name},
	}
}

// OwnNetwork and NetworkNamespace pass runtimes.NetnsReporter through,
// for a driver that is one.
func (r *Recorder) OwnNetwork() bool {
	rep, ok := r.Runtime.(runtimes.NetnsReporter)
	return ok && rep.OwnNetwork()
}

func (r *Recorder) NetworkNamespace(ctx context.Context, name string) (*os.File, error) {
	rep, ok := r.Runtime.(runtimes.NetnsReporter)
	if !ok {
		return nil, fmt.Errorf("driver %T keeps no network namespace of its own", r.Runtime)
	}
	return rep.NetworkNamespace(ctx, name)
}

// Ping passes through to a driver that works through a daemon; any other
// always answers.
func (r *Recorder) Ping(ctx context.Context) error {
	if p, ok := r.Runtime.(runtimes.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// Usage passes through to the wrapped driver when it reports usage.
func (r *Recorder) Usage(name string) (runtimes.Usage, error) {
	ur, ok := r.Runtime.(runtimes.UsageReader)
	if !ok {
		return runtimes.Usage{}, fmt.Errorf("driver %T reports no usage", r.Runtime)
	}
	return ur.Usage(name)
}

// DescribeAs prepares sb's agent as the Sandbox reconciler would (its host
// id and areas) and describes sb's instance, with no class: for tests that
// act as another owner of an agent, or call a driver directly.
func DescribeAs(sb *v1alpha1.Sandbox, host instance.Host) (runtimes.Instance, error) {
	if err := instance.Prepare(&sb.Spec, host); err != nil {
		return runtimes.Instance{}, err
	}
	return instance.FromSandbox(sb, nil, host)
}
