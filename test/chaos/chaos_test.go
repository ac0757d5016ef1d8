//go:build e2e

// Package chaos_test churns SessionClaims against the real controller
// binary while killing it, kube-apiserver and (when enabled) containerd
// with SIGKILL at random moments, and checks the controller's invariants
// all along and once things settle. `go test -tags e2e ./test/chaos/` is the short
// run CI does (about a minute of churn, bwrap, controller kills and one
// API server outage); `make test-chaos` is the long one. Knobs:
//
//	CHAOS_DURATION  how long claims churn (default 60s)
//	CHAOS_SEED      seed of every random choice (default: the clock; logged)
//	CHAOS_OUTAGES   API server outages, comma-separated (default 5s)
//	CHAOS_KEEP      set: keep the run's directory (logs) even when it passes
//	CHAOS_BACKENDS  bwrap (default) or bwrap,containerd (needs
//	                hack/containerd.sh env; containerd is then killed too)
//	CHAOS_REPORT    a file the figures are appended to, one table row
package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/cluster"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const (
	// settleTimeout bounds how long the invariants may take to hold once
	// the faults stop; a violation is what still fails after it.
	settleTimeout = 2 * time.Minute
	// probeTimeout bounds one recovery: a claim made after a restart that
	// is not Ready by then is a violation.
	probeTimeout = 90 * time.Second
	// maxLive bounds the claims alive at once, so a long run measures
	// churn rather than an ever larger list.
	maxLive = 40
	// markerName is written into every area and mount source once; it
	// must be there, unchanged, at every check.
	markerName = ".chaos-marker"
	// idleSlack covers the rounding of idleSince up to the second and one
	// reconcile after the idle window ends.
	idleSlack = 5 * time.Second
)

var areaNames = []string{"workspace", "memories", "blocks", "skills", "tasks"}

type config struct {
	duration   time.Duration
	seed       uint64
	outages    []time.Duration
	containerd bool
	report     string
}

func readConfig(t *testing.T) config {
	c := config{duration: 60 * time.Second, seed: uint64(time.Now().UnixNano()), outages: []time.Duration{5 * time.Second}}
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CHAOS_DURATION=%q: want a positive duration such as 7m", v)
		}
		c.duration = d
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want an unsigned integer", v)
		}
		c.seed = s
	}
	if v, ok := os.LookupEnv("CHAOS_OUTAGES"); ok {
		c.outages = nil
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			d, err := time.ParseDuration(f)
			if err != nil || d <= 0 {
				t.Fatalf("CHAOS_OUTAGES=%q: want positive durations separated by commas", v)
			}
			c.outages = append(c.outages, d)
		}
	}
	for _, b := range strings.Split(os.Getenv("CHAOS_BACKENDS"), ",") {
		switch strings.TrimSpace(b) {
		case "", "bwrap":
		case "containerd":
			c.containerd = true
		default:
			t.Fatalf("CHAOS_BACKENDS: unknown backend %q (bwrap, containerd)", b)
		}
	}
	c.report = os.Getenv("CHAOS_REPORT")
	return c
}

// sandboxCase is one Sandbox of the run and what its instance must do.
type sandboxCase struct {
	name, agent string
	backend     v1alpha1.Backend
	keepRunning bool
	idle        time.Duration
	// src is the host directory mounted at /workspace/data (bwrap).
	src string
}

type run struct {
	t       *testing.T
	cfg     config
	root    string
	dir     string
	ns      string
	cp      *cluster.ControlPlane
	ctrl    *cluster.Controller
	k8s     client.Client
	drivers map[v1alpha1.Backend]runtimes.Runtime
	areas   string
	state   string
	cases   []sandboxCase
	markers map[string]string // path -> content

	claimSeq atomic.Int64
	created  atomic.Int64
	deleted  atomic.Int64

	mu         sync.Mutex
	live       map[string]bool
	violations []string
	recoveries map[string][]time.Duration
	kills      map[string]int
	selfExits  int
	// faultMu keeps one fault at a time (a restart finishes before the
	// next kill).
	faultMu sync.Mutex
}

func TestChaos(t *testing.T) {
	cfg := readConfig(t)
	// envtest logs through controller-runtime; the controller's own log
	// is a file of the run.
	logf.SetLogger(logr.Discard())
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(t, "envtest binaries", p)
	}
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	if cfg.containerd {
		testenv.ContainerdEnv(t, false)
	}
	t.Logf("chaos: seed %d (rerun with CHAOS_SEED=%d), churn %s, API server outages %v, containerd %v", cfg.seed, cfg.seed, cfg.duration, cfg.outages, cfg.containerd)
	r := start(t, cfg)
	r.createSandboxes()

	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration)
	began := time.Now()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); r.churn(ctx, uint64(i)) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); r.faults(ctx) }()
	go func() { defer wg.Done(); r.watch(ctx) }()
	wg.Wait()
	cancel()
	churned := time.Since(began)

	r.settle("after the churn")
	r.drain()
	r.figures(churned)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.violations) > 0 {
		t.Errorf("%d invariant violations:\n%s\ncontroller log: %s", len(r.violations), strings.Join(r.violations, "\n"), r.ctrl.LogPath)
	}
}

func start(t *testing.T, cfg config) *run {
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sandbox-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	// Agents' ids must reach their areas through this directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	r := &run{
		t: t, cfg: cfg, root: root, dir: dir, ns: "chaos",
		areas: filepath.Join(dir, "areas"), state: filepath.Join(dir, "state"),
		live: map[string]bool{}, recoveries: map[string][]time.Duration{}, kills: map[string]int{},
		markers: map[string]string{}, drivers: map[v1alpha1.Backend]runtimes.Runtime{},
	}
	bin, err := cluster.BuildController(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.cp, err = cluster.StartControlPlane(filepath.Join(root, "config", "crd", "bases"), dir); err != nil {
		t.Fatal(err)
	}
	r.k8s = r.cp.Client
	backends := "bwrap"
	if cfg.containerd {
		backends = "bwrap,containerd"
	}
	r.ctrl = &cluster.Controller{
		Bin: bin, LogPath: filepath.Join(dir, "controller.log"),
		Args: []string{
			"--areas-root", r.areas, "--state-dir", r.state, "--backends", backends,
			"--health-probe-bind-address", "0", "--api-bind-address", "0",
		},
		Env: []string{"KUBECONFIG=" + r.cp.Kubeconfig},
	}
	t.Cleanup(func() {
		if err := r.ctrl.Stop(); err != nil {
			t.Errorf("stopping the controller: %v", err)
		}
		if err := r.cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
		if err := bwrap.DetachTrees(filepath.Join(r.state, "bwrap")); err != nil {
			t.Errorf("detaching the bwrap mount trees: %v", err)
		}
		if t.Failed() || os.Getenv("CHAOS_KEEP") != "" {
			t.Logf("kept %s for a look (controller.log, kube-apiserver.log)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if err := r.ctrl.Start(); err != nil {
		t.Fatal(err)
	}
	bw, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(r.state, "bwrap")})
	if err != nil {
		t.Fatal(err)
	}
	r.drivers[v1alpha1.BackendBwrap] = bw
	if cfg.containerd {
		ns := os.Getenv("CONTAINERD_NAMESPACE")
		if ns == "" {
			ns = containerd.DefaultNamespace
		}
		cd, err := containerd.New(context.Background(), containerd.Config{Address: os.Getenv(testenv.ContainerdAddressEnv), Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cd.Close() })
		r.drivers[v1alpha1.BackendContainerd] = cd
	}
	return r
}

// createSandboxes makes the Sandboxes (keepRunning, a 2s idle window, the
// default 5m), brings each up once with a claim, and writes the markers.
func (r *run) createSandboxes() {
	ctx := context.Background()
	if err := r.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); err != nil {
		r.t.Fatal(err)
	}
	// Unique agents: a shared containerd holds other suites' containers.
	tag := fmt.Sprintf("%04x", r.cfg.seed&0xffff)
	add := func(b v1alpha1.Backend, i int, keep bool, idle time.Duration) {
		c := sandboxCase{name: fmt.Sprintf("%s-%d", b, i), agent: fmt.Sprintf("chaos-%s-%s-%d", tag, b, i), backend: b, keepRunning: keep, idle: idle}
		if b == v1alpha1.BackendBwrap {
			c.src = filepath.Join(r.dir, "src", c.name)
			if err := os.MkdirAll(c.src, 0o755); err != nil {
				r.t.Fatal(err)
			}
		}
		r.cases = append(r.cases, c)
	}
	for i := range 6 {
		switch i % 3 {
		case 0:
			add(v1alpha1.BackendBwrap, i, true, 5*time.Minute)
		case 1:
			add(v1alpha1.BackendBwrap, i, false, 2*time.Second)
		default:
			add(v1alpha1.BackendBwrap, i, false, 5*time.Minute)
		}
	}
	if r.cfg.containerd {
		add(v1alpha1.BackendContainerd, 0, false, 3*time.Second)
		add(v1alpha1.BackendContainerd, 1, false, 5*time.Minute)
	}
	for _, c := range r.cases {
		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: c.name},
			Spec: v1alpha1.SandboxSpec{
				Agent: c.agent, Backend: c.backend, KeepRunning: c.keepRunning,
				IdleTimeout: &metav1.Duration{Duration: c.idle},
			},
		}
		if c.src != "" {
			sb.Spec.Mounts = []v1alpha1.Mount{{Source: c.src, Target: "data", Mode: v1alpha1.MountReadWrite}}
		}
		if c.backend == v1alpha1.BackendContainerd {
			sb.Spec.Containerd = &v1alpha1.ContainerdSpec{Image: os.Getenv("CONTAINERD_TEST_IMAGE")}
		}
		if err := r.k8s.Create(ctx, sb); err != nil {
			r.t.Fatalf("creating Sandbox %s: %v", c.name, err)
		}
		if err := r.createClaim(ctx, "first-"+c.name, c.name); err != nil {
			r.t.Fatal(err)
		}
	}
	for _, c := range r.cases {
		if _, err := r.waitReady(ctx, "first-"+c.name, probeTimeout); err != nil {
			r.t.Fatalf("the first claim of %s: %v (controller log %s)", c.name, err, r.ctrl.LogPath)
		}
		for _, a := range areaNames {
			r.markers[filepath.Join(r.areas, c.agent, a, markerName)] = "area " + a + " of " + c.agent
		}
		if c.src != "" {
			r.markers[filepath.Join(c.src, markerName)] = "mount source of " + c.name
		}
	}
	for p, content := range r.markers {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			r.t.Fatalf("writing marker: %v", err)
		}
	}
}

// createClaim creates a claim that the churn may delete.
func (r *run) createClaim(ctx context.Context, name, sandbox string) error {
	if err := r.createOwnClaim(ctx, name, sandbox); err != nil {
		return err
	}
	r.churnable(name)
	return nil
}

func (r *run) churnable(name string) {
	r.mu.Lock()
	r.live[name] = true
	r.mu.Unlock()
}

// createOwnClaim creates a claim the churn does not know of yet.
func (r *run) createOwnClaim(ctx context.Context, name, sandbox string) error {
	c := &v1alpha1.SessionClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name},
		Spec:       v1alpha1.SessionClaimSpec{SandboxName: sandbox, Session: "chaos"},
	}
	if err := r.k8s.Create(ctx, c); err != nil {
		return fmt.Errorf("creating claim %s: %w", name, err)
	}
	r.created.Add(1)
	return nil
}

// waitReady polls one claim until it is Ready and returns how long that took.
func (r *run) waitReady(ctx context.Context, name string, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	deadline := t0.Add(limit)
	var last []metav1.Condition
	for time.Now().Before(deadline) {
		var c v1alpha1.SessionClaim
		err := r.k8s.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: name}, &c)
		if apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("claim %s is gone", name)
		}
		if err == nil {
			last = c.Status.Conditions
			if meta.IsStatusConditionTrue(c.Status.Conditions, v1alpha1.ConditionReady) {
				return time.Since(t0), nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("claim %s not Ready within %s: %s", name, limit, conditions(last))
}

// churn creates and deletes claims on random Sandboxes until ctx ends;
// errors while the API server is away are expected and ignored.
func (r *run) churn(ctx context.Context, worker uint64) {
	rng := rand.New(rand.NewPCG(r.cfg.seed, worker))
	for ctx.Err() == nil {
		time.Sleep(time.Duration(20+rng.IntN(130)) * time.Millisecond)
		r.mu.Lock()
		names := make([]string, 0, len(r.live))
		for n := range r.live {
			names = append(names, n)
		}
		r.mu.Unlock()
		opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if len(names) < 4 || (len(names) < maxLive && rng.Float64() < 0.55) {
			sb := r.cases[rng.IntN(len(r.cases))].name
			_ = r.createClaim(opCtx, fmt.Sprintf("c-%d", r.claimSeq.Add(1)), sb)
		} else {
			sort.Strings(names)
			r.deleteClaim(opCtx, names[rng.IntN(len(names))])
		}
		cancel()
	}
}

func (r *run) deleteClaim(ctx context.Context, name string) {
	err := r.k8s.Delete(ctx, &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name}})
	if err != nil && !apierrors.IsNotFound(err) {
		return
	}
	r.mu.Lock()
	if r.live[name] {
		delete(r.live, name)
		if err == nil {
			r.deleted.Add(1)
		}
	}
	r.mu.Unlock()
}

// faults kills the controller every 2 to 6 seconds (down for up to a
// second), kube-apiserver once per outage spread over the run, and, with
// containerd, the daemon about every fourth fault; after each it measures
// how long a new claim takes to be Ready.
func (r *run) faults(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.cfg.seed, 1000))
	began := time.Now()
	outages := slices.Clone(r.cfg.outages)
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(2000+rng.IntN(4000)) * time.Millisecond):
		}
		due := len(outages) > 0 && time.Since(began) >= r.cfg.duration*time.Duration(len(r.cfg.outages)-len(outages)+1)/time.Duration(len(r.cfg.outages)+1)
		switch {
		case due:
			r.apiOutage(ctx, outages[0], rng, n)
			outages = outages[1:]
		case r.cfg.containerd && rng.IntN(4) == 0:
			r.containerdCrash(ctx, rng, n)
		default:
			r.controllerKill(ctx, rng, n)
		}
	}
}

func (r *run) controllerKill(ctx context.Context, rng *rand.Rand, n int) {
	r.faultMu.Lock()
	if err := r.ctrl.Kill(); err != nil {
		r.faultMu.Unlock()
		r.violate("killing the controller: %v", err)
		return
	}
	r.count("controller")
	time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
	if err := r.ctrl.Start(); err != nil {
		r.faultMu.Unlock()
		r.t.Fatalf("restarting the controller: %v", err)
	}
	r.faultMu.Unlock()
	r.probe(ctx, "controller", rng, n, v1alpha1.BackendBwrap)
}

func (r *run) apiOutage(ctx context.Context, d time.Duration, rng *rand.Rand, n int) {
	r.faultMu.Lock()
	defer r.faultMu.Unlock()
	if err := r.cp.KillAPIServer(); err != nil {
		r.t.Fatalf("killing kube-apiserver: %v", err)
	}
	r.count("kube-apiserver")
	time.Sleep(d)
	if err := r.cp.StartAPIServer(); err != nil {
		r.t.Fatalf("restarting kube-apiserver: %v", err)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.cp.WaitReady(wctx); err != nil {
		r.t.Fatalf("kube-apiserver after an outage of %s: %v", d, err)
	}
	// The probe is made once the API server answers again: what is
	// measured is the controller's catch-up, not kube-apiserver's start.
	r.probe(context.Background(), "kube-apiserver", rng, n, v1alpha1.BackendBwrap)
}

func (r *run) containerdCrash(ctx context.Context, rng *rand.Rand, n int) {
	r.faultMu.Lock()
	sh := filepath.Join(r.root, "hack", "containerd.sh")
	if out, err := exec.Command(sh, "crash").CombinedOutput(); err != nil {
		r.faultMu.Unlock()
		r.violate("crashing containerd: %v: %s", err, out)
		return
	}
	r.count("containerd")
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
	if out, err := exec.Command(sh, "start").CombinedOutput(); err != nil {
		r.faultMu.Unlock()
		r.t.Fatalf("restarting containerd: %v: %s", err, out)
	}
	r.faultMu.Unlock()
	r.probe(ctx, "containerd", rng, n, v1alpha1.BackendContainerd)
}

// probe makes a claim on a random Sandbox of the backend and records how
// long it takes to be Ready; the claim then joins the churn.
func (r *run) probe(ctx context.Context, kind string, rng *rand.Rand, n int, b v1alpha1.Backend) {
	var names []string
	for _, c := range r.cases {
		if c.backend == b {
			names = append(names, c.name)
		}
	}
	name := fmt.Sprintf("probe-%d", n)
	t0 := time.Now()
	attempts, lastErr := 0, error(nil)
	for {
		attempts++
		err := r.createOwnClaim(context.Background(), name, names[rng.IntN(len(names))])
		if err == nil || apierrors.IsAlreadyExists(err) {
			break
		}
		lastErr = err
		if time.Since(t0) > probeTimeout {
			r.violate("after a %s kill: %v", kind, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	created := time.Since(t0)
	// The churn may delete the probe only once it has been measured.
	defer r.churnable(name)
	if _, err := r.waitReady(context.Background(), name, probeTimeout); err != nil {
		r.violate("after a %s kill: %v (%s)", kind, err, r.stalled())
		return
	}
	total := time.Since(t0)
	// Where the time went: the API server accepting the claim, then the
	// controller making it Ready.
	r.t.Logf("probe %s after a %s kill: created after %s (%d attempts, last refusal: %v), Ready %s later",
		name, kind, created.Round(time.Millisecond), attempts, lastErr, (total - created).Round(time.Millisecond))
	r.mu.Lock()
	r.recoveries[kind] = append(r.recoveries[kind], total)
	r.mu.Unlock()
}

// watch checks what must hold at every moment: areas and markers intact,
// no instance without its Sandbox, the controller not exiting on its own.
func (r *run) watch(ctx context.Context) {
	for ctx.Err() == nil {
		time.Sleep(time.Second)
		r.faultMu.Lock()
		if r.ctrl.Exited() {
			r.mu.Lock()
			r.selfExits++
			r.mu.Unlock()
			if b, _ := os.ReadFile(r.ctrl.LogPath); strings.Contains(string(b), "panic:") {
				r.violate("the controller panicked (log %s)", r.ctrl.LogPath)
			}
			if err := r.ctrl.Start(); err != nil {
				r.t.Errorf("restarting the controller after it exited: %v", err)
			}
		}
		r.faultMu.Unlock()
		for _, p := range r.checkDisk() {
			r.violate("%s", p)
		}
		for _, p := range r.checkOrphans(ctx) {
			r.violate("%s", p)
		}
	}
}

func (r *run) checkDisk() []string {
	var out []string
	for p, want := range r.markers {
		b, err := os.ReadFile(p)
		if err != nil || string(b) != want {
			out = append(out, fmt.Sprintf("marker %s: %v (content %q)", p, err, b))
		}
	}
	return out
}

// checkOrphans lists each driver's instances of this run: every one must
// be the instance of one of the Sandboxes, owned by it.
func (r *run) checkOrphans(ctx context.Context) []string {
	owners := map[string]string{}
	prefix := v1alpha1.InstanceName(fmt.Sprintf("chaos-%04x-", r.cfg.seed&0xffff))
	for _, c := range r.cases {
		owners[v1alpha1.InstanceName(c.agent)] = r.ns + "/" + c.name
	}
	var out []string
	for b, d := range r.drivers {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		states, err := d.List(lctx)
		cancel()
		if err != nil {
			continue // containerd may be down on purpose
		}
		for _, s := range states {
			if !strings.HasPrefix(s.Name, prefix) {
				continue
			}
			if want, ok := owners[s.Name]; !ok || s.Owner != want {
				out = append(out, fmt.Sprintf("orphan %s instance %s (owner %q)", b, s.Name, s.Owner))
			}
		}
	}
	return out
}

// invariants lists what does not hold now of what must hold once the
// faults stop: every claim Bound and Ready (or saying why not), none
// stuck deleting, counts equal to the live claims, instances running
// exactly when the count, keepRunning or the idle window says so.
func (r *run) invariants(ctx context.Context) []string {
	var claims v1alpha1.SessionClaimList
	var sbs v1alpha1.SandboxList
	if err := r.k8s.List(ctx, &claims, client.InNamespace(r.ns)); err != nil {
		return []string{fmt.Sprintf("listing claims: %v", err)}
	}
	if err := r.k8s.List(ctx, &sbs, client.InNamespace(r.ns)); err != nil {
		return []string{fmt.Sprintf("listing Sandboxes: %v", err)}
	}
	var out []string
	count := map[string]int32{}
	for _, c := range claims.Items {
		if c.DeletionTimestamp != nil {
			out = append(out, fmt.Sprintf("claim %s: deleting since %s, finalizers %v", c.Name, c.DeletionTimestamp.Format(time.RFC3339), c.Finalizers))
			continue
		}
		count[c.Spec.SandboxName]++
		bound := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionBound)
		ready := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case bound == nil || bound.Status != metav1.ConditionTrue:
			out = append(out, fmt.Sprintf("claim %s not Bound: %s", c.Name, conditions(c.Status.Conditions)))
		case ready == nil || ready.Status != metav1.ConditionTrue:
			out = append(out, fmt.Sprintf("claim %s not Ready: %s", c.Name, conditions(c.Status.Conditions)))
		}
	}
	cases := map[string]sandboxCase{}
	for _, c := range r.cases {
		cases[c.name] = c
	}
	for _, sb := range sbs.Items {
		c := cases[sb.Name]
		if sb.Status.Claims != count[sb.Name] {
			out = append(out, fmt.Sprintf("Sandbox %s: status.claims %d, live claims %d", sb.Name, sb.Status.Claims, count[sb.Name]))
		}
		if sb.Status.ObservedGeneration != sb.Generation {
			out = append(out, fmt.Sprintf("Sandbox %s: observedGeneration %d of generation %d", sb.Name, sb.Status.ObservedGeneration, sb.Generation))
		}
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := r.drivers[c.backend].Inspect(ictx, v1alpha1.InstanceName(c.agent))
		cancel()
		if err != nil {
			out = append(out, fmt.Sprintf("Sandbox %s: inspecting its instance: %v", sb.Name, err))
			continue
		}
		wanted := count[sb.Name] > 0 || c.keepRunning
		idleUntil := time.Time{}
		if sb.Status.IdleSince != nil {
			idleUntil = sb.Status.IdleSince.Add(c.idle + idleSlack)
		}
		switch {
		case wanted && !st.Running:
			out = append(out, fmt.Sprintf("Sandbox %s: %d claims, keepRunning %v, instance not running", sb.Name, count[sb.Name], c.keepRunning))
		case wanted && !meta.IsStatusConditionTrue(sb.Status.Conditions, v1alpha1.ConditionReady):
			out = append(out, fmt.Sprintf("Sandbox %s: instance wanted, not Ready: %s", sb.Name, conditions(sb.Status.Conditions)))
		case !wanted && st.Running && time.Now().After(idleUntil):
			out = append(out, fmt.Sprintf("Sandbox %s: no claim, instance running past its idle window (idleSince %v, idleTimeout %s)", sb.Name, sb.Status.IdleSince, c.idle))
		}
	}
	if len(sbs.Items) != len(r.cases) {
		out = append(out, fmt.Sprintf("%d Sandboxes, want %d", len(sbs.Items), len(r.cases)))
	}
	out = append(out, r.checkDisk()...)
	return append(out, r.checkOrphans(ctx)...)
}

// settle waits for the invariants to hold; what still fails after
// settleTimeout is a violation.
func (r *run) settle(when string) {
	ctx := context.Background()
	if r.ctrl.Exited() {
		_ = r.ctrl.Start()
	}
	deadline := time.Now().Add(settleTimeout)
	for {
		problems := r.invariants(ctx)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range problems {
				r.violate("%s, %s later: %s", when, settleTimeout, p)
			}
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// drain deletes every claim, then every Sandbox: nothing may be left
// holding a finalizer, no instance may stay, and the areas stay.
func (r *run) drain() {
	ctx := context.Background()
	if err := r.k8s.DeleteAllOf(ctx, &v1alpha1.SessionClaim{}, client.InNamespace(r.ns)); err != nil {
		r.violate("deleting the claims: %v", err)
	}
	r.mu.Lock()
	clear(r.live)
	r.mu.Unlock()
	r.settle("after deleting every claim")
	for _, c := range r.cases {
		if err := r.k8s.Delete(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: c.name}}); err != nil {
			r.violate("deleting Sandbox %s: %v", c.name, err)
		}
	}
	deadline := time.Now().Add(settleTimeout)
	for {
		var problems []string
		var sbs v1alpha1.SandboxList
		if err := r.k8s.List(ctx, &sbs, client.InNamespace(r.ns)); err != nil {
			problems = append(problems, err.Error())
		}
		for _, sb := range sbs.Items {
			problems = append(problems, fmt.Sprintf("Sandbox %s still there (finalizers %v)", sb.Name, sb.Finalizers))
		}
		for _, c := range r.cases {
			st, err := r.drivers[c.backend].Inspect(ctx, v1alpha1.InstanceName(c.agent))
			if err != nil || st.Exists {
				problems = append(problems, fmt.Sprintf("instance of %s still there after its Sandbox went (%v)", c.name, err))
			}
		}
		problems = append(problems, r.checkDisk()...)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range problems {
				r.violate("after deleting the Sandboxes: %s", p)
			}
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (r *run) figures(churned time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	backends := "bwrap"
	if r.cfg.containerd {
		backends = "bwrap, containerd"
	}
	rec := func(kind string) string {
		d := slices.Clone(r.recoveries[kind])
		if len(d) == 0 {
			return "-"
		}
		slices.Sort(d)
		return fmt.Sprintf("%d ms / %d ms", d[(len(d)-1)/2].Milliseconds(), d[len(d)-1].Milliseconds())
	}
	outages := make([]string, len(r.cfg.outages))
	for i, d := range r.cfg.outages {
		outages[i] = d.String()
	}
	row := fmt.Sprintf("| %s | %s | %d | %d / %d | %d | %d (%s) | %d | %d | %s | %s | %s | %d |",
		churned.Round(time.Second), backends, r.cfg.seed, r.created.Load(), r.deleted.Load(),
		r.kills["controller"], r.kills["kube-apiserver"], strings.Join(outages, ", "), r.kills["containerd"], r.selfExits,
		rec("controller"), rec("kube-apiserver"), rec("containerd"), len(r.violations))
	r.t.Logf("chaos figures:\n| churn | backends | seed | claims created / deleted | controller kills | API server kills (outages) | containerd kills | controller exits | recovery p50 / max: controller | API server | containerd | violations |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n%s", row)
	if r.cfg.report != "" {
		f, err := os.OpenFile(r.cfg.report, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			r.t.Errorf("writing CHAOS_REPORT: %v", err)
			return
		}
		defer f.Close()
		fmt.Fprintln(f, row)
	}
}

// stalled says whether the controller is stuck as a whole or on some
// claims: its reconcile counts and the claims it has not bound.
func (r *run) stalled() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := r.ctrl.Reconciles(ctx)
	if err != nil {
		return err.Error()
	}
	var claims v1alpha1.SessionClaimList
	if err := r.k8s.List(ctx, &claims, client.InNamespace(r.ns)); err != nil {
		return fmt.Sprintf("reconciles %v; listing claims: %v", recs, err)
	}
	var unbound []string
	for _, c := range claims.Items {
		if meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionBound) == nil {
			unbound = append(unbound, fmt.Sprintf("%s (%s old)", c.Name, time.Since(c.CreationTimestamp.Time).Round(time.Second)))
		}
	}
	return fmt.Sprintf("reconciles since the last start %v; %d of %d claims without Bound: %v", recs, len(unbound), len(claims.Items), unbound)
}

func (r *run) count(kind string) {
	r.mu.Lock()
	r.kills[kind]++
	r.mu.Unlock()
}

func (r *run) violate(format string, args ...any) {
	msg := fmt.Sprintf("%s: ", time.Now().Format("15:04:05.000")) + fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	// The continuous checks repeat a lasting problem every second.
	if len(r.violations) > 0 && strings.HasSuffix(r.violations[len(r.violations)-1], fmt.Sprintf(format, args...)) {
		return
	}
	r.violations = append(r.violations, msg)
	r.t.Logf("VIOLATION %s", msg)
}

func conditions(cs []metav1.Condition) string {
	if len(cs) == 0 {
		return "no conditions"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s/%s %q", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, ", ")
}
