//go:build scale

// Package scale is `make bench-scale`: many Sandboxes with a claim each
// against a real kube-apiserver, the controller running as its own process
// (the binary a node runs), so its memory is the process's and nothing of
// the test's. It is built only with the scale tag (make bench-scale sets
// it), so `go test ./...` never starts a thousand sandboxes.
package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/config/admission"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// readyTimeout bounds the wait for every claim; a loaded two-core machine
// starts a thousand bwrap sandboxes in minutes, not hours.
const readyTimeout = 40 * time.Minute

// figures are one controller binary's measurements.
type figures struct {
	label    string
	n        int
	allReady time.Duration
	// floor is how long the same 16 clients take, on the same API
	// server, to create the same n Sandboxes and n claims with no
	// controller running: what the API server needs just to store them.
	floor time.Duration
	// withWrites is the same clients creating the same objects and then
	// making, each for its own Sandbox and claim, the writes the
	// controller makes (a metadata patch of the Sandbox unless the
	// finalizer policy gave it the finalizer, its status, the claim's
	// status), with no controller: what the API server needs for all of
	// it, the floor of any controller that writes as much.
	withWrites time.Duration
	// policy says whether the finalizer policy of config/admission was
	// installed (SCALE_FINALIZER_POLICY=0 leaves it out).
	policy                  bool
	idleRSS, readyRSS, peak int64
	readyAnon, readyFile    int64
	idleHeap, readyHeap     int64
	// cpu is the controller's CPU time (user and system) from idle to
	// all Ready.
	cpu                      time.Duration
	managedFieldsBytesServer int
	profile                  string
	// passes are the controller's reconciles from idle to all Ready, by
	// controller (controller_runtime_reconcile_total).
	passes map[string]float64
	// writes are the API server's write requests from idle to all Ready,
	// by verb and resource, less the test's own creates: the
	// controller's.
	writes map[string]float64
}

func TestScale(t *testing.T) {
	table := testenv.BenchOut()
	if table == "" {
		t.Fatal("set " + testenv.BenchOutEnv + " to the page to write into (make bench-scale does)")
	}
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(t, "envtest binaries", p)
	}
	testenv.Binary(t, "bwrap", "install the bubblewrap package (hack/install-deps.sh)")
	counts := []int{1000}
	if v := os.Getenv("SCALE_SANDBOXES"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("SCALE_SANDBOXES=%q: want positive counts separated by commas", v)
			}
			counts = append(counts, n)
		}
	}
	// The API server's own logs are not what this measures.
	logf.SetLogger(logr.Discard())
	type build struct{ label, path, profile string }
	bins := []build{{"this build", os.Getenv("SCALE_CONTROLLER_BIN"), "this-build"}}
	if b := os.Getenv("SCALE_BASELINE_BIN"); b != "" {
		label := os.Getenv("SCALE_BASELINE_LABEL")
		if label == "" {
			label = "baseline"
		}
		bins = append(bins, build{label, b, "baseline"})
	}
	if bins[0].path == "" {
		t.Fatal("SCALE_CONTROLLER_BIN must name the controller binary to measure (make bench-scale builds bin/sandbox-controller)")
	}
	for i := range bins {
		bins[i].path = installed(t, bins[i].path)
	}
	var all []figures
	for _, n := range counts {
		for _, b := range bins {
			f := measure(t, b.path, b.profile, n)
			f.label = b.label
			t.Logf("%s: %s; controller writes a Sandbox %s", b.label, policyLine(f), writesLine(f))
			t.Logf("%s: %d claims Ready in %s (%.2f× the API server's %s to create them, %.2f× its %s to create them and take the controller's writes); controller CPU %s (%.1f ms a Sandbox); RSS idle %s, all Ready %s (anonymous %s, file %s), peak %s; heap in use idle %s, all Ready %s%s",
				f.label, n, f.allReady.Round(time.Second), ratio(f.allReady, f.floor), f.floor.Round(100*time.Millisecond),
				ratio(f.allReady, f.withWrites), f.withWrites.Round(100*time.Millisecond), f.cpu.Round(100*time.Millisecond),
				perSandbox(f.cpu, n), mib(f.idleRSS), mib(f.readyRSS), mib(f.readyAnon), mib(f.readyFile), mib(f.peak), mib(f.idleHeap), mib(f.readyHeap), f.profile)
			all = append(all, f)
		}
	}
	if exactHeap() {
		// Recording every allocation makes the controller several times
		// slower: its times and CPU are not this build's, and the page
		// keeps the figures it has.
		t.Logf("%s=%s: every allocation of the controller recorded; its times and CPU are not comparable, and %s is left as it was", pprofEnv, pprofExact, table)
		return
	}
	if err := testenv.WriteBenchTable(table, "bench-scale", render(all)); err != nil {
		t.Fatalf("writing the table: %v", err)
	}
}

// pprofEnv asks for profiles of each run, kept in bin/: any value gives a
// CPU profile of the first minute and a heap profile at all Ready, the
// heap sampled as Go samples it (an allocation in about 512 KiB);
// pprofExact records every allocation instead.
const (
	pprofEnv   = "SCALE_PPROF"
	pprofExact = "exact"
)

// exactHeap says whether the heap profile records every allocation. At
// the default rate a thousand Sandboxes' live heap of about 12 MiB is a
// few dozen samples, each standing for half a mebibyte, too coarse to say
// which structure holds what.
func exactHeap() bool { return os.Getenv(pprofEnv) == pprofExact }

// withGodebug adds setting to a GODEBUG value, after what it holds (a
// later setting of the same name wins).
func withGodebug(godebug, setting string) string {
	if godebug == "" {
		return setting
	}
	return godebug + "," + setting
}

// installed copies the controller binary bin, and the starter beside it
// when there is one, into a directory of the test's with plain writes,
// and returns the copy's path. A binary just written by the linker sits
// in the page cache in larger pieces than one installed from an image,
// and each page the controller touches then maps more of it: the same
// bytes showed 58 MiB of RSS at --help as the linker left them, 47 MiB
// copied. The copy is what a node runs.
func installed(t *testing.T, bin string) string {
	t.Helper()
	// Not below the test's own directory, which only root may search.
	dir, err := os.MkdirTemp("", "scale-controller-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, name := range []string{filepath.Base(bin), "sandbox-holder"} {
		src := filepath.Join(filepath.Dir(bin), name)
		in, err := os.Open(src)
		if errors.Is(err, os.ErrNotExist) && name != filepath.Base(bin) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
		if err == nil {
			_, err = io.Copy(out, in)
			err = errors.Join(err, out.Close())
		}
		in.Close()
		if err != nil {
			t.Fatalf("installing %s: %v", src, err)
		}
	}
	// Searchable by every user, as bin's is: the agents' commands start
	// through the starter beside the controller.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, filepath.Base(bin))
}

// measure starts a fresh API server and the controller binary against it,
// creates n Sandboxes with a claim each and waits until every claim is Ready.
func measure(t *testing.T, bin, profile string, n int) figures {
	crds, err := filepath.Abs("../../../config/crd/bases")
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{crds}, ErrorIfCRDPathMissing: true}
	cfg, err := localcp.StartEnvironment(env)
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	defer func() { _ = env.Stop() }()
	admin, err := env.AddUser(envtest.User{Name: "scale-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := testenv.SharedDir(t)
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	var f figures
	f.n = n
	// The finalizer policy, as `make deploy` installs it, before the
	// floors: its cost at each create is the API server's, in the floors
	// too.
	if os.Getenv("SCALE_FINALIZER_POLICY") != "0" {
		if err := admission.InstallFinalizer(context.Background(), c, "default", time.Minute); err != nil {
			t.Fatal(err)
		}
		f.policy = true
	}
	// A first round warms the API server and the clients up (the first
	// creates of a kind in a fresh API server cost more), so that neither
	// floor pays for it: 100 pairs, made and deleted.
	createAll(t, c, "warm-up", min(n, 100), nil)
	deleteAll(t, c, "warm-up")
	// The floor first, before the controller starts: the same creates in
	// a namespace of their own, deleted again (nothing holds them yet;
	// envtest runs no namespace controller, so the objects are deleted
	// one kind at a time and the namespace is left, empty).
	f.floor = createAll(t, c, "floor", n, nil)
	deleteAll(t, c, "floor")
	f.withWrites = createAll(t, c, "floor-writes", n, controllerWrites)
	deleteAll(t, c, "floor-writes")
	g := NewWithT(t)

	metrics := freeAddr(t)
	pprofAddr := "0"
	if os.Getenv(pprofEnv) != "" {
		pprofAddr = freeAddr(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", kcPath,
		"--areas-root", filepath.Join(dir, "areas"), "--backends", "bwrap",
		"--metrics-bind-address", metrics, "--health-probe-bind-address", "0", "--api-bind-address", "0",
		"--pprof-bind-address", pprofAddr, "--log-level", "error")
	logf, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 10 * time.Second
	if exactHeap() {
		cmd.Env = append(os.Environ(), "GODEBUG="+withGodebug(os.Getenv("GODEBUG"), "memprofilerate=1"))
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		// The controller leaves its instances' mount trees for the next
		// one to adopt; a throw-away run clears them.
		state := filepath.Join(dir, "areas", ".runtime", "bwrap")
		if err := bwrap.DetachTrees(state); err != nil {
			t.Errorf("detaching the mount trees: %v", err)
		}
		// And their cgroups: thousands left behind exhaust the inotify
		// watches a kubelet's cAdvisor needs on this machine.
		if err := bwrap.RemoveCgroups(state); err != nil {
			t.Errorf("removing the instances' cgroups: %v", err)
		}
	}()

	// Idle: the caches are synced (the metrics endpoint answers once the
	// manager runs) and nothing exists yet.
	g.Eventually(func() error {
		var err error
		f.idleHeap, err = heapInUse(metrics)
		return err
	}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	f.idleRSS = procStatus(t, cmd.Process.Pid, "VmRSS")
	idleCPU := cpuTime(t, cmd.Process.Pid)
	idleWrites := apiWrites(t, cfg)
	idlePasses, err := reconciles(metrics)
	if err != nil {
		t.Fatal(err)
	}
	var profiled chan string
	if pprofAddr != "0" {
		// A CPU profile of the first minute of the run (or all of it).
		profiled = make(chan string, 1)
		go func() {
			profiled <- cpuProfile(pprofAddr, profilePath(t, "cpu", profile, n), time.Minute)
		}()
	}

	ns := "scale"
	// A watch, not a list polled every second: at 10,000 claims the lists
	// loaded the API server this measures, and a second's polling was a
	// tenth of the figure at 1,000.
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	readyCtx, stopReady := context.WithTimeout(context.Background(), readyTimeout)
	defer stopReady()
	ready := watchReady(readyCtx, wc, ns, n)
	start := time.Now()
	createAll(t, c, ns, n, nil)
	for waiting := true; waiting; {
		select {
		case <-ready.done:
			waiting = false
		case <-time.After(time.Second):
			if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
				t.Fatalf("the controller exited; its log is %s", filepath.Join(dir, "controller.log"))
			}
		}
	}
	if ready.err != nil {
		t.Fatalf("waiting for %d claims Ready (%d were; controller log: %s): %v", n, ready.count, filepath.Join(dir, "controller.log"), ready.err)
	}
	f.allReady = ready.at.Sub(start)
	if floors, _ := filepath.Glob(filepath.Join(dir, "areas", "floor-*")); len(floors) > 0 {
		t.Fatalf("the controller ran %d of the floor's Sandboxes: the measurement counts them", len(floors))
	}
	f.cpu = cpuTime(t, cmd.Process.Pid) - idleCPU
	f.writes = apiWrites(t, cfg)
	for k, v := range idleWrites {
		f.writes[k] -= v
	}
	if f.passes, err = reconciles(metrics); err != nil {
		t.Fatal(err)
	}
	for k, v := range idlePasses {
		f.passes[k] -= v
	}
	f.writes["POST sandboxes"] -= float64(n)
	f.writes["POST sessionclaims"] -= float64(n)
	if profiled != nil {
		f.profile = "; " + <-profiled
	}
	f.readyRSS = procStatus(t, cmd.Process.Pid, "VmRSS")
	f.peak = procStatus(t, cmd.Process.Pid, "VmHWM")
	f.readyAnon = procStatus(t, cmd.Process.Pid, "RssAnon")
	f.readyFile = procStatus(t, cmd.Process.Pid, "RssFile")
	if f.readyHeap, err = heapInUse(metrics); err != nil {
		t.Fatal(err)
	}
	if profiled != nil {
		f.profile += "; " + saveProfile(fmt.Sprintf("http://%s/debug/pprof/heap", pprofAddr), profilePath(t, "heap", profile, n), "heap profile at all Ready")
	}
	var sb v1alpha1.Sandbox
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "agent-00000"}, &sb); err != nil {
		t.Fatal(err)
	}
	for _, m := range sb.ManagedFields {
		if m.FieldsV1 != nil {
			f.managedFieldsBytesServer += len(m.FieldsV1.GetRawBytes())
		}
	}
	return f
}

// createAll creates n Sandboxes with a claim each in namespace ns, with 16
// clients at once, and returns how long that took.
func createAll(t *testing.T, c client.Client, ns string, n int, then func(client.Client, *v1alpha1.Sandbox, *v1alpha1.SessionClaim) error) time.Duration {
	t.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	sandboxes := make(chan int)
	var wg sync.WaitGroup
	var createErr error
	var errOnce sync.Once
	start := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range sandboxes {
				name := fmt.Sprintf("agent-%05d", i)
				sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
					Spec: v1alpha1.SandboxSpec{Agent: ns + "-" + name, Backend: v1alpha1.BackendBwrap, Binaries: []v1alpha1.BinaryName{"git"}}}
				claim := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-session"},
					Spec: v1alpha1.SessionClaimSpec{SandboxName: name, Session: "scale"}}
				for _, o := range []client.Object{sb, claim} {
					if err := c.Create(context.Background(), o); err != nil {
						errOnce.Do(func() { createErr = fmt.Errorf("creating %s: %w", o.GetName(), err) })
					}
				}
				if then != nil {
					if err := then(c, sb, claim); err != nil {
						errOnce.Do(func() { createErr = fmt.Errorf("writing %s as the controller would: %w", sb.Name, err) })
					}
				}
			}
		}()
	}
	for i := range n {
		sandboxes <- i
	}
	close(sandboxes)
	wg.Wait()
	if createErr != nil {
		t.Fatal(createErr)
	}
	return time.Since(start)
}

// policyLine says whether the finalizer policy was installed for f.
func policyLine(f figures) string {
	if f.policy {
		return "the finalizer policy of config/admission installed"
	}
	return "no finalizer policy (SCALE_FINALIZER_POLICY=0)"
}

// deleteAll deletes the Sandboxes and claims of the floor's namespace ns
// and waits until they are gone. envtest runs no namespace controller, so
// the objects are deleted one kind at a time and the namespace is left,
// empty. The finalizer the policy gave the Sandboxes is taken off, as no
// controller runs to do it.
func deleteAll(t *testing.T, c client.Client, ns string) {
	t.Helper()
	for _, o := range []client.Object{&v1alpha1.SessionClaim{}, &v1alpha1.Sandbox{}} {
		if err := c.DeleteAllOf(context.Background(), o, client.InNamespace(ns)); err != nil {
			t.Fatalf("deleting the floor's objects: %v", err)
		}
	}
	var held v1alpha1.SandboxList
	if err := c.List(context.Background(), &held, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range held.Items {
		sb := &held.Items[i]
		if !slices.Contains(sb.Finalizers, v1alpha1.Finalizer) {
			continue
		}
		before := sb.DeepCopy()
		sb.Finalizers = slices.DeleteFunc(sb.Finalizers, func(f string) bool { return f == v1alpha1.Finalizer })
		if err := c.Patch(context.Background(), sb, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			t.Fatalf("letting the floor's Sandbox %s go: %v", sb.Name, err)
		}
	}
	NewWithT(t).Eventually(func() (int, error) {
		var sbs v1alpha1.SandboxList
		var cls v1alpha1.SessionClaimList
		err := errors.Join(c.List(context.Background(), &sbs, client.InNamespace(ns)), c.List(context.Background(), &cls, client.InNamespace(ns)))
		return len(sbs.Items) + len(cls.Items), err
	}).WithTimeout(5*time.Minute).WithPolling(time.Second).Should(BeZero(), "the floor's objects are not gone")
}

// controllerWrites makes, for a Sandbox and its claim just created, the
// writes the controller makes for them (the page lists them: a metadata
// patch of the Sandbox where its create did not give it the finalizer, its
// status, the claim's status), with the status a running Sandbox and a
// Ready claim show. The metadata patch sets an annotation where the
// controller sets its finalizer, which would hold the floor's objects once
// deleted with no controller to let them go.
func controllerWrites(c client.Client, sb *v1alpha1.Sandbox, claim *v1alpha1.SessionClaim) error {
	ctx := context.Background()
	before := sb.DeepCopy()
	if !slices.Contains(sb.Finalizers, v1alpha1.Finalizer) {
		sb.Annotations = map[string]string{"bench.sandbox.cireilclaw.dev/floor": "written"}
		if err := c.Patch(ctx, sb, client.MergeFrom(before)); err != nil {
			return err
		}
	}
	now := metav1.Now()
	cond := func(typ, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: now, ObservedGeneration: sb.Generation}
	}
	before = sb.DeepCopy()
	mem := resource.MustParse("1Mi")
	sb.Status = v1alpha1.SandboxStatus{ObservedGeneration: sb.Generation, Claims: 1, Instance: v1alpha1.InstanceName(sb.Spec.Agent),
		Usage: &v1alpha1.SandboxUsage{Memory: &mem, Processes: 1},
		Conditions: []metav1.Condition{
			cond(v1alpha1.ConditionSandboxEnforced, v1alpha1.ReasonEnforced, "the bwrap policy holds: namespaces, seccomp, no new privileges"),
			cond(v1alpha1.ConditionRuntimeReady, v1alpha1.ReasonRunning, "the instance is running"),
			cond(v1alpha1.ConditionReady, v1alpha1.ReasonRunning, "the instance is running with 1 claim"),
		}}
	if err := c.Status().Patch(ctx, sb, client.MergeFrom(before)); err != nil {
		return err
	}
	beforeClaim := claim.DeepCopy()
	claim.Status = v1alpha1.SessionClaimStatus{ObservedGeneration: claim.Generation, Instance: sb.Status.Instance, Endpoint: "https://127.0.0.1:9443",
		Conditions: []metav1.Condition{
			cond(v1alpha1.ConditionBound, v1alpha1.ReasonBound, "bound to Sandbox "+sb.Name),
			cond(v1alpha1.ConditionReady, v1alpha1.ReasonRunning, "Sandbox "+sb.Name+" is running"),
		}}
	return c.Status().Patch(ctx, claim, client.MergeFrom(beforeClaim))
}

// apiWrites reads the API server's count of write requests
// (apiserver_request_total), summed by verb and resource (with its
// subresource after a slash).
func apiWrites(t *testing.T, cfg *rest.Config) map[string]float64 {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	if err != nil {
		t.Fatalf("reading the API server's metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	label := func(labels, name string) string {
		_, v, ok := strings.Cut(labels, name+`="`)
		if !ok {
			return ""
		}
		v, _, _ = strings.Cut(v, `"`)
		return v
	}
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		verb := label(labels, "verb")
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE":
		default:
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		key := verb + " " + label(labels, "resource")
		if sub := label(labels, "subresource"); sub != "" {
			key += "/" + sub
		}
		out[key] += v
	}
	if resp.StatusCode != http.StatusOK || len(out) == 0 {
		t.Fatalf("the API server's metrics answered %s with no write counts", resp.Status)
	}
	return out
}

// writesLine says what the controller wrote, a Sandbox.
func writesLine(f figures) string {
	keys := make([]string, 0, len(f.writes))
	total := 0.0
	for k, v := range f.writes {
		// A few writes in all (the test's namespace, the leader's lease)
		// are not the Sandboxes'.
		if v/float64(f.n) >= 0.005 {
			keys = append(keys, k)
			total += v
		}
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.2f", k, f.writes[k]/float64(f.n))
	}
	passes := make([]string, 0, len(f.passes))
	for _, k := range slices.Sorted(maps.Keys(f.passes)) {
		if f.passes[k] > 0 {
			passes = append(passes, fmt.Sprintf("%s %.2f", k, f.passes[k]/float64(f.n)))
		}
	}
	return fmt.Sprintf("%.2f (%s); its passes a Sandbox: %s", total/float64(f.n), strings.Join(parts, ", "), strings.Join(passes, ", "))
}

// readyWatch follows the claims of a namespace until enough are Ready.
type readyWatch struct {
	done chan struct{}
	// at is when the event that made the last one Ready came; count is
	// how many were Ready at the end, err why it ended short.
	at    time.Time
	count int
	err   error
}

// watchReady lists and watches the claims of ns (again after a watch
// ends) and closes done when n of them are Ready.
func watchReady(ctx context.Context, c client.WithWatch, ns string, n int) *readyWatch {
	w := &readyWatch{done: make(chan struct{})}
	ready := map[string]bool{}
	set := func(name string, r bool) {
		if r != ready[name] {
			if r {
				w.count++
			} else {
				w.count--
			}
		}
		ready[name] = r
	}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			var list v1alpha1.SessionClaimList
			if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
				w.err = err
				return
			}
			for i := range list.Items {
				set(list.Items[i].Name, meta.IsStatusConditionTrue(list.Items[i].Status.Conditions, v1alpha1.ConditionReady))
			}
			if w.count >= n {
				w.at = time.Now()
				return
			}
			events, err := c.Watch(ctx, &v1alpha1.SessionClaimList{}, client.InNamespace(ns),
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
			if err != nil {
				w.err = err
				return
			}
			for ev := range events.ResultChan() {
				claim, ok := ev.Object.(*v1alpha1.SessionClaim)
				if !ok {
					break // an error event: list again
				}
				set(claim.Name, ev.Type != watch.Deleted && meta.IsStatusConditionTrue(claim.Status.Conditions, v1alpha1.ConditionReady))
				if w.count >= n {
					w.at = time.Now()
					events.Stop()
					return
				}
			}
			events.Stop()
		}
		w.err = ctx.Err()
	}()
	return w
}

// cpuTime is the user and system time process pid used so far.
func cpuTime(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("reading the controller's CPU time: %v", err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parsing /proc/%d/stat: %v %v", pid, err1, err2)
	}
	// USER_HZ is 100 on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// profilePath is where the profile of kind (cpu, heap) of a run of n
// Sandboxes by one build (this-build, baseline) is kept: the repository's
// bin/, which outlives the test's scratch directory.
func profilePath(t *testing.T, kind, build string, n int) string {
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, fmt.Sprintf("scale-%s-%d-%s.pprof", kind, n, build))
}

// cpuProfile saves a CPU profile of d from the pprof endpoint at addr to
// file, and says where (or why not).
func cpuProfile(addr, file string, d time.Duration) string {
	return saveProfile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())), file, "CPU profile of the first "+d.String())
}

// saveProfile saves the profile at url to file, and says where (or why
// not).
func saveProfile(url, file, what string) string {
	resp, err := http.Get(url)
	if err != nil {
		return "no " + what + ": " + err.Error()
	}
	defer resp.Body.Close()
	out, err := os.Create(file)
	if err == nil {
		_, err = io.Copy(out, resp.Body)
		err = errors.Join(err, out.Close())
	}
	if err != nil {
		return "no " + what + ": " + err.Error()
	}
	return what + ": go tool pprof -top " + file
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func perSandbox(cpu time.Duration, n int) float64 {
	return float64(cpu.Microseconds()) / 1000 / float64(n)
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metricLines calls line with each line of the controller's metrics
// endpoint at addr, until line says to stop.
func metricLines(addr string, line func(string) (stop bool)) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if line(sc.Text()) {
			return nil
		}
	}
	return sc.Err()
}

// reconciles reads controller_runtime_reconcile_total from the
// controller's metrics, summed by controller.
func reconciles(addr string) (map[string]float64, error) {
	out := map[string]float64{}
	var bad error
	err := metricLines(addr, func(line string) bool {
		labels, ok := strings.CutPrefix(line, "controller_runtime_reconcile_total{")
		if !ok {
			return false
		}
		labels, value, ok := strings.Cut(labels, "} ")
		_, name, found := strings.Cut(labels, `controller="`)
		if !ok || !found {
			return false
		}
		name, _, _ = strings.Cut(name, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			bad = fmt.Errorf("controller_runtime_reconcile_total of %s at %s/metrics: %w", name, addr, err)
			return true
		}
		out[name] += v
		return false
	})
	return out, errors.Join(err, bad)
}

// heapInUse reads go_memstats_heap_inuse_bytes from the controller's
// metrics endpoint.
func heapInUse(addr string) (int64, error) {
	var v string
	if err := metricLines(addr, func(line string) bool {
		var ok bool
		v, ok = strings.CutPrefix(line, "go_memstats_heap_inuse_bytes ")
		return ok
	}); err != nil {
		return 0, err
	}
	if v == "" {
		return 0, fmt.Errorf("no go_memstats_heap_inuse_bytes at %s/metrics", addr)
	}
	f, err := strconv.ParseFloat(v, 64)
	return int64(f), err
}

// procStatus reads a kB field of /proc/PID/status in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the controller's memory: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s in /proc/%d/status: %v", field, pid, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func render(all []figures) string {
	var b strings.Builder
	b.WriteString(`Written by ` + "`make bench-scale`" + ` (test/e2e/scale): a fresh kube-apiserver and
etcd (envtest), the controller binary started as its own process with the
bwrap backend and logging at error level, then Sandboxes (binaries: git)
with one SessionClaim each, created by 16 clients at once. "All Ready" runs
from the first create until a watch on the claims tells that the last one
is Ready. The finalizer policy of config/admission is installed first, as
make deploy installs it (SCALE_FINALIZER_POLICY=0 leaves it out), and 100
pairs are made and deleted to warm the API server up. "API server alone"
is the same creates by the same clients on the same API server just
before, with no controller running: the floor the ratio is taken against.
"With the controller's writes" is those creates followed, by each client
for its own pair, by the writes the controller makes for a Sandbox and its
claim (listed below: the Sandbox's metadata where the policy did not give
it the finalizer, its status, the claim's status), again with no
controller: the floor of any controller that writes as much, so its ratio
is what the controller itself adds. Controller CPU is its user and system time from
idle to all Ready. Memory is the controller process's: RSS from /proc (anonymous:
heap, stacks and runtime; file-backed: the pages of the binary it touched,
the binary copied as an image installs it, not as the linker left it),
heap in use from its own go_memstats_heap_inuse_bytes. "Idle" is after the
caches synced, before the first Sandbox.

`)
	fmt.Fprintf(&b, "| controller | Sandboxes (a claim each) | API server alone creates them in | all Ready after | ratio | API server alone, with the controller's writes | ratio to that | controller CPU | CPU a Sandbox | RSS idle | RSS all Ready | of which anonymous | of which file-backed | peak RSS | heap in use idle | heap in use all Ready |\n")
	fmt.Fprintf(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, f := range all {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %.2f× | %s | %.2f× | %s | %.1f ms | %s | %s | %s | %s | %s | %s | %s |\n", f.label, f.n, f.floor.Round(100*time.Millisecond),
			f.allReady.Round(100*time.Millisecond), ratio(f.allReady, f.floor), f.withWrites.Round(100*time.Millisecond), ratio(f.allReady, f.withWrites),
			f.cpu.Round(100*time.Millisecond), perSandbox(f.cpu, f.n),
			mib(f.idleRSS), mib(f.readyRSS), mib(f.readyAnon), mib(f.readyFile), mib(f.peak), mib(f.idleHeap), mib(f.readyHeap))
	}
	b.WriteString("\nThe controller's API writes a Sandbox and its claim, from idle to all Ready (the API server's request counts, less the test's two creates), and its passes (reconciles) a Sandbox by controller:\n\n")
	for _, f := range all {
		fmt.Fprintf(&b, "- %s, %d, %s: %s\n", f.label, f.n, policyLine(f), writesLine(f))
	}
	if len(all) > 0 {
		fmt.Fprintf(&b, "\nManaged fields of one Sandbox on the server (what the cache no longer keeps): %d bytes.\n", all[0].managedFieldsBytesServer)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "\nMachine: %d cores, load average %s at the end of the run.\n", goruntime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "))
	return b.String()
}
