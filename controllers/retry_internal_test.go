package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

func TestRetryLimiterCapsByFailure(t *testing.T) {
	unreachable := &url.Error{Op: "Patch", URL: "https://127.0.0.1:6443", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
	for _, tc := range []struct {
		name string
		err  error
		cap  time.Duration
	}{
		{"runtime unavailable retries within seconds", runtimes.Errorf(runtimes.ReasonUnavailable, "inspecting", "cireilclaw-a", "containerd is unreachable"), fastRetryCap},
		{"API server unreachable retries within seconds", fmt.Errorf("writing status: %w", unreachable), fastRetryCap},
		{"API server unavailable retries within seconds", apierrors.NewServiceUnavailable("etcd leader changed"), fastRetryCap},
		{"deadline retries within seconds", context.DeadlineExceeded, fastRetryCap},
		{"image not found backs off to a minute", runtimes.Errorf(runtimes.ReasonImageNotFound, "ensuring", "cireilclaw-a", "no image x"), slowRetryCap},
		{"runtime error backs off to a minute", fmt.Errorf("ensuring: %w", runtimes.Errorf(runtimes.ReasonFailed, "ensuring", "cireilclaw-a", "refused")), slowRetryCap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newRetryLimiter()
			req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}
			var last time.Duration
			for i := range 40 {
				l.note(req, tc.err)
				d := l.When(req)
				if i == 0 && d != retryBase {
					t.Fatalf("first retry after %s, want %s", d, retryBase)
				}
				if d < last || d > tc.cap {
					t.Fatalf("retry %d after %s (previous %s), want growing up to %s", i, d, last, tc.cap)
				}
				last = d
			}
			if last != tc.cap {
				t.Fatalf("retries settle at %s, want %s", last, tc.cap)
			}
			if l.NumRequeues(req) != 40 {
				t.Fatalf("NumRequeues %d, want 40", l.NumRequeues(req))
			}
			l.Forget(req)
			if d := l.When(req); d != retryBase {
				t.Fatalf("after Forget the first retry comes after %s, want %s", d, retryBase)
			}
		})
	}
}

func TestWithRetriesTurnsExpectedRacesIntoRetries(t *testing.T) {
	gr := schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "sessionclaims"}
	conflict := apierrors.NewConflict(gr, "c", errors.New("the object has been modified"))
	notFound := apierrors.NewNotFound(gr, "c")
	for _, tc := range []struct {
		name    string
		err     error
		wantErr bool
		after   time.Duration
	}{
		{"conflict is retried at once without an error", fmt.Errorf("adding the finalizer: %w", conflict), false, conflictRetry},
		{"conflict joined with a status write is retried without an error", errors.Join(fmt.Errorf("writing status: %w", conflict)), false, conflictRetry},
		{"not found after a delete is retried without an error", fmt.Errorf("updating claim: %w", notFound), false, time.Second},
		{"other errors stay errors", errors.New("disk on fire"), true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newRetryLimiter()
			r := withRetries(l, reconcile.Func(func(context.Context, reconcile.Request) (ctrl.Result, error) { return ctrl.Result{}, tc.err }))
			res, err := r.Reconcile(context.Background(), reconcile.Request{})
			if (err != nil) != tc.wantErr || res.RequeueAfter != tc.after {
				t.Fatalf("got %+v, %v; want requeue after %s, error %v", res, err, tc.after, tc.wantErr)
			}
		})
	}
}

// downRuntime answers List only while up.
type downRuntime struct {
	runtimes.Runtime
	up    atomic.Bool
	lists atomic.Int32
}

func (d *downRuntime) List(context.Context) ([]runtimes.State, error) {
	d.lists.Add(1)
	if !d.up.Load() {
		return nil, runtimes.Errorf(runtimes.ReasonUnavailable, "listing", "", "daemon is down")
	}
	return nil, nil
}

func TestRuntimeProbeRequeuesUnavailableSandboxesOncePerRecovery(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	sandbox := func(name string, reason string, node string) *v1alpha1.Sandbox {
		sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1alpha1.SandboxSpec{Agent: name, NodeName: node}}
		c := &conditionChanges{generation: 1}
		c.set(v1alpha1.ConditionRuntimeReady, false, reason, "m")
		applyConditions(&sb.Status.Conditions, c.list)
		return sb
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&v1alpha1.Sandbox{}, indexSandboxWaitingRuntime, runtimeWaiting).WithObjects(
		sandbox("waiting", v1alpha1.ReasonRuntimeUnavailable, ""),
		sandbox("also-waiting", v1alpha1.ReasonRuntimeUnavailable, ""),
		sandbox("broken-spec", v1alpha1.ReasonInvalidSpec, ""),
		sandbox("other-node", v1alpha1.ReasonRuntimeUnavailable, "elsewhere"),
	).Build()
	rt := &downRuntime{}
	out := make(chan event.GenericEvent, 16)
	p := &runtimeProbe{reader: c, runtimes: map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: rt},
		interval: time.Second, out: out, sent: map[types.NamespacedName]bool{}}
	ctx := context.Background()
	sent := func() []string { return sentNames(out) }

	p.probe(ctx)
	if got := sent(); len(got) != 0 || rt.lists.Load() != 1 {
		t.Fatalf("runtime down: sent %v after %d probes, want nothing after 1", got, rt.lists.Load())
	}
	rt.up.Store(true)
	p.probe(ctx)
	if got := sent(); len(got) != 2 {
		t.Fatalf("runtime back: sent %v, want the two Sandboxes of this node that wait for it", got)
	}
	p.probe(ctx)
	if got := sent(); len(got) != 0 {
		t.Fatalf("still up: sent %v again, want nothing (the back-off takes over)", got)
	}
	rt.up.Store(false)
	p.probe(ctx)
	rt.up.Store(true)
	p.probe(ctx)
	if got := sent(); len(got) != 2 {
		t.Fatalf("second recovery: sent %v, want both again", got)
	}

	// Nothing waits: the runtime is not called at all.
	idle := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&v1alpha1.Sandbox{}, indexSandboxWaitingRuntime, runtimeWaiting).WithObjects(sandbox("fine", v1alpha1.ReasonRunning, "")).Build()
	p.reader = idle
	rt.lists.Store(0)
	p.probe(ctx)
	if rt.lists.Load() != 0 {
		t.Fatalf("no Sandbox waits, yet the runtime was probed %d times", rt.lists.Load())
	}
}

// countingReader counts the objects its Lists return.
type countingReader struct {
	client.Reader
	listed int
}

func (r *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := r.Reader.List(ctx, list, opts...)
	if l, ok := list.(*v1alpha1.SandboxList); ok {
		r.listed += len(l.Items)
	}
	return err
}

// The probe runs every second whatever the number of Sandboxes: it reads
// the few that wait for their runtime, never all of them (a list of
// 10,000 Sandboxes a second was 5% of the controller's CPU, and as much
// again collecting what it allocated).
func TestRuntimeProbeReadsOnlyTheSandboxesThatWait(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&v1alpha1.Sandbox{}, indexSandboxWaitingRuntime, runtimeWaiting)
	for i := range 500 {
		reason := v1alpha1.ReasonRunning
		if i%250 == 0 {
			reason = v1alpha1.ReasonRuntimeUnavailable
		}
		sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("sb-%d", i)},
			Spec: v1alpha1.SandboxSpec{Agent: fmt.Sprintf("agent-%d", i)}}
		c := &conditionChanges{generation: 1}
		c.set(v1alpha1.ConditionRuntimeReady, reason == v1alpha1.ReasonRunning, reason, "m")
		applyConditions(&sb.Status.Conditions, c.list)
		b = b.WithObjects(sb)
	}
	reader := &countingReader{Reader: b.Build()}
	rt := &downRuntime{}
	rt.up.Store(true)
	out := make(chan event.GenericEvent, 16)
	p := &runtimeProbe{reader: reader, runtimes: map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: rt},
		interval: time.Second, out: out, sent: map[types.NamespacedName]bool{}}
	p.probe(context.Background())
	if len(out) != 2 {
		t.Fatalf("sent %d Sandboxes, want the 2 that wait", len(out))
	}
	if reader.listed != 2 {
		t.Fatalf("the probe read %d Sandboxes to find the 2 that wait", reader.listed)
	}
}

// sentNames drains what a probe sent, by name, sorted.
func sentNames(out chan event.GenericEvent) []string {
	var names []string
	for {
		select {
		case ev := <-out:
			names = append(names, ev.Object.GetName())
		default:
			sort.Strings(names)
			return names
		}
	}
}

// daemonRuntime is a driver that works through a daemon (runtimes.Pinger)
// whose answers the test turns on and off.
type daemonRuntime struct {
	downRuntime
	pings atomic.Int32
}

func (d *daemonRuntime) Ping(context.Context) error {
	d.pings.Add(1)
	if !d.up.Load() {
		return runtimes.Errorf(runtimes.ReasonUnavailable, "pinging", "", "daemon is down")
	}
	return nil
}

// A running instance outlives its daemon (containerd's shims, Incus's
// containers), and a Sandbox whose status no longer changes has no pass to
// notice the daemon is gone: the probe pings the daemon every interval and,
// when it stops answering, sends every Sandbox of that backend on this node
// that does not report RuntimeUnavailable yet, once.
func TestRuntimeProbeSendsTheSandboxesOfADaemonThatGoes(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	sandbox := func(name string, backend v1alpha1.Backend, reason, node string) *v1alpha1.Sandbox {
		sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1alpha1.SandboxSpec{Agent: name, Backend: backend, NodeName: node}}
		c := &conditionChanges{generation: 1}
		c.set(v1alpha1.ConditionRuntimeReady, reason == v1alpha1.ReasonRunning, reason, "m")
		applyConditions(&sb.Status.Conditions, c.list)
		return sb
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&v1alpha1.Sandbox{}, indexSandboxWaitingRuntime, runtimeWaiting).WithObjects(
		sandbox("running", v1alpha1.BackendContainerd, v1alpha1.ReasonRunning, ""),
		sandbox("stopped", v1alpha1.BackendContainerd, v1alpha1.ReasonStopped, ""),
		sandbox("says-so", v1alpha1.BackendContainerd, v1alpha1.ReasonRuntimeUnavailable, ""),
		sandbox("other-node", v1alpha1.BackendContainerd, v1alpha1.ReasonRunning, "elsewhere"),
		sandbox("bwrap", v1alpha1.BackendBwrap, v1alpha1.ReasonRunning, ""),
	).Build()
	daemon := &daemonRuntime{}
	noDaemon := &downRuntime{}
	noDaemon.up.Store(true)
	out := make(chan event.GenericEvent, 16)
	p := &runtimeProbe{reader: c, interval: time.Second, out: out, sent: map[types.NamespacedName]bool{},
		runtimes: map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendContainerd: daemon, v1alpha1.BackendBwrap: noDaemon}}
	ctx := context.Background()
	sent := func() []string { return sentNames(out) }

	daemon.up.Store(true)
	p.probe(ctx)
	if got := sent(); len(got) != 1 || got[0] != "says-so" {
		t.Fatalf("daemon up: sent %v, want only the Sandbox that waits for it", got)
	}
	if daemon.pings.Load() == 0 || daemon.lists.Load() != 0 {
		t.Fatalf("daemon up: %d pings and %d lists, want pings only", daemon.pings.Load(), daemon.lists.Load())
	}
	daemon.up.Store(false)
	p.probe(ctx)
	if got := sent(); !slices.Equal(got, []string{"running", "stopped"}) {
		t.Fatalf("daemon gone: sent %v, want [running stopped] (this node's, of its backend, not saying so yet)", got)
	}
	p.probe(ctx)
	if got := sent(); len(got) != 0 {
		t.Fatalf("daemon still gone: sent %v again, want nothing (the passes report it, the back-off retries)", got)
	}
	daemon.up.Store(true)
	p.probe(ctx)
	if got := sent(); !slices.Equal(got, []string{"says-so"}) {
		t.Fatalf("daemon back: sent %v, want [says-so] (the one that waits)", got)
	}
	daemon.up.Store(false)
	p.probe(ctx)
	if got := sent(); !slices.Equal(got, []string{"running", "stopped"}) {
		t.Fatalf("daemon gone a second time: sent %v, want [running stopped] again", got)
	}

	// A daemon that never answered has nothing to lose: the first passes
	// after the start report it.
	fresh := &runtimeProbe{reader: c, interval: time.Second, out: out, sent: map[types.NamespacedName]bool{},
		runtimes: map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendContainerd: &daemonRuntime{}}}
	fresh.probe(ctx)
	if got := sent(); len(got) != 0 {
		t.Fatalf("daemon down from the start: sent %v, want nothing", got)
	}
}
