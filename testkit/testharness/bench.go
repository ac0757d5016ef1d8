package testharness

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// APIRoundTrips is the floor of a claim figure: writing an object and
// reading it back, with no controller in between.
func (e *Env) APIRoundTrips(n int) []time.Duration {
	ns := e.NewNamespace()
	var out []time.Duration
	for i := range n {
		out = append(out, e.APIRoundTrip(ns, fmt.Sprintf("floor-%d", i)))
	}
	return out
}

// APIRoundTrip is one sample of APIRoundTrips: the ConfigMap ns/name
// written and read back. A benchmark that takes one beside each of its
// own samples compares the two at the same moments of a run, whatever
// else the machine did meanwhile.
func (e *Env) APIRoundTrip(ns, name string) time.Duration {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	start := time.Now()
	Expect(e.Client.Create(context.Background(), cm)).To(Succeed())
	Expect(e.Client.Get(context.Background(), client.ObjectKeyFromObject(cm), &corev1.ConfigMap{})).To(Succeed())
	return time.Since(start)
}

// answeredKey is the annotation an Answerer writes.
const answeredKey = "bench.sandbox.cireilclaw.dev/answered"

// Answerer is the floor of a controller's answer: a watch on the
// ConfigMaps of a namespace of its own that answers each new one with one
// write and does nothing else, as a controller answers a new claim with
// its status. A claim can be Ready no sooner than the API server takes to
// write an object, tell a watcher, take the watcher's write and tell the
// client: Sample measures exactly that.
type Answerer struct{ *answering }

// StartAnswerer starts the watcher; Stop ends it.
func (e *Env) StartAnswerer() *Answerer {
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+answeredKey+`":"true"}}}`))
	return &Answerer{e.startAnswering(func() client.ObjectList { return &corev1.ConfigMapList{} }, "ConfigMap",
		func(ctx context.Context, o client.Object) error { return e.Client.Patch(ctx, o, patch) })}
}

// Sample creates the ConfigMap name and returns the time until a watch
// of the client's tells it was answered.
func (a *Answerer) Sample(name string) time.Duration {
	return a.sample(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: name}}, func(o runtime.Object) bool {
		cm, isCM := o.(*corev1.ConfigMap)
		return isCM && cm.Annotations[answeredKey] != ""
	})
}

// answering is a watch on a namespace of its own that answers each object
// added there with one write; the floors of the claim benchmark.
type answering struct {
	e       *Env
	ns      string
	what    string
	newList func() client.ObjectList
	stop    context.CancelFunc
	failed  chan error
}

// startAnswering watches the objects newList lists in a new namespace and
// calls answer for each one added.
func (e *Env) startAnswering(newList func() client.ObjectList, what string, answer func(context.Context, client.Object) error) *answering {
	ctx, cancel := context.WithCancel(context.Background())
	a := &answering{e: e, ns: e.NewNamespace(), what: what, newList: newList, stop: cancel, failed: make(chan error, 1)}
	w, err := e.watchClient().Watch(ctx, newList(), client.InNamespace(a.ns))
	Expect(err).NotTo(HaveOccurred())
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(client.Object)
			if !ok || ev.Type != watch.Added {
				continue
			}
			if err := answer(ctx, o); err != nil && ctx.Err() == nil {
				a.fail(fmt.Errorf("answering %s %s: %w", what, o.GetName(), err))
			}
		}
		if ctx.Err() == nil {
			a.fail(fmt.Errorf("the answering watch on namespace %s ended", a.ns))
		}
	}()
	return a
}

// fail hands sample the first reason the watch stopped answering.
func (a *answering) fail(err error) {
	select {
	case a.failed <- err:
	default:
	}
}

// sample creates obj and returns the time until a watch of it tells
// answered of what it sees.
func (a *answering) sample(obj client.Object, answered func(runtime.Object) bool) time.Duration {
	name := obj.GetName()
	w, err := a.e.watchClient().Watch(context.Background(), a.newList(), client.InNamespace(a.ns), client.MatchingFields{"metadata.name": name})
	Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	start := time.Now()
	Expect(a.e.Client.Create(context.Background(), obj)).To(Succeed())
	timeout := time.After(Timeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			Expect(ok).To(BeTrue(), "the watch of %s %s ended before its answer", a.what, name)
			if answered(ev.Object) {
				return time.Since(start)
			}
		case err := <-a.failed:
			Fail(err.Error())
		case <-timeout:
			Fail(fmt.Sprintf("%s %s was not answered within %s", a.what, name, Timeout))
		}
	}
}

// Stop ends the watch.
func (a *answering) Stop() { a.stop() }

// APIBurst is the floor of a burst figure: n objects written and read
// back by n concurrent clients; each duration runs from the burst's start
// until that object is back.
func (e *Env) APIBurst(n int) []time.Duration {
	ns := e.NewNamespace()
	var wg sync.WaitGroup
	out := make([]time.Duration, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("burst-%d", i)}}
			Expect(e.Client.Create(context.Background(), cm)).To(Succeed())
			Expect(e.Client.Get(context.Background(), client.ObjectKeyFromObject(cm), &corev1.ConfigMap{})).To(Succeed())
			out[i] = time.Since(start)
		}()
	}
	wg.Wait()
	return out
}

// ClaimBurst creates the claims (all in one namespace) at once and
// returns, for each, the time from the burst's start until a watch tells
// it is Ready.
func (e *Env) ClaimBurst(claims []*v1alpha1.SessionClaim) []time.Duration {
	ns := claims[0].Namespace
	w := e.WatchClaims(ns)
	defer w.Stop()
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			Expect(e.Client.Create(context.Background(), c)).To(Succeed())
		}()
	}
	// Only the burst's own claims count: the namespace may hold others
	// (the claim that keeps a shared Sandbox running).
	inBurst := map[string]bool{}
	for _, c := range claims {
		inBurst[c.Name] = true
	}
	ready := map[string]time.Duration{}
	see := func(c *v1alpha1.SessionClaim) {
		if _, seen := ready[c.Name]; !seen && inBurst[c.Name] && meta.IsStatusConditionTrue(c.Status.Conditions, v1alpha1.ConditionReady) {
			ready[c.Name] = time.Since(start)
		}
	}
	timeout := time.After(Timeout)
	for len(ready) < len(claims) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The API server may end a watch that a burst floods;
				// catch up with a list and watch again.
				w = e.WatchClaims(ns)
				defer w.Stop()
				var list v1alpha1.SessionClaimList
				Expect(e.Client.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
				for i := range list.Items {
					see(&list.Items[i])
				}
				continue
			}
			if c, isClaim := ev.Object.(*v1alpha1.SessionClaim); isClaim {
				see(c)
			}
		case <-timeout:
			Fail(fmt.Sprintf("%d of %d claims Ready within %s", len(ready), len(claims), Timeout))
		}
	}
	wg.Wait()
	out := make([]time.Duration, 0, len(ready))
	for _, d := range ready {
		out = append(out, d)
	}
	return out
}

// Percentile is the p-th percentile (0..1) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p+0.5)]
}

// Ms formats a duration in milliseconds with one decimal.
func Ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// BenchRow is one line of a benchmark table: our figure beside a baseline
// measured in the same run.
type BenchRow struct {
	What     string
	Ours     []time.Duration
	Baseline string
	Base     []time.Duration
}

// RenderTable renders rows as a markdown table with p50, p99 and the p50
// ratio to the baseline.
func RenderTable(rows []BenchRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| measurement | samples | p50 | p99 | baseline (same run) | baseline p50 | baseline p99 | p50 ratio |\n")
	fmt.Fprintf(&b, "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		p50, b50 := Percentile(r.Ours, 0.5), Percentile(r.Base, 0.5)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %.2f× |\n", r.What, len(r.Ours), Ms(p50), Ms(Percentile(r.Ours, 0.99)),
			r.Baseline, Ms(b50), Ms(Percentile(r.Base, 0.99)), float64(p50)/float64(b50))
	}
	return b.String()
}

// ClaimWatch follows one claim through a watch, so a benchmark learns of a
// condition as soon as the API server tells of it without loading the
// machine with reads. Start it before the claim is created.
type ClaimWatch struct {
	w    watch.Interface
	last *v1alpha1.SessionClaim
}

// WatchClaim starts watching the claim ns/name (which may not exist yet).
func (e *Env) WatchClaim(ns, name string) *ClaimWatch {
	return &ClaimWatch{w: e.watchClaims(ns, client.MatchingFields{"metadata.name": name})}
}

// WatchClaims starts watching every claim of a namespace.
func (e *Env) WatchClaims(ns string) watch.Interface { return e.watchClaims(ns) }

func (e *Env) watchClaims(ns string, opts ...client.ListOption) watch.Interface {
	w, err := e.watchClient().Watch(context.Background(), &v1alpha1.SessionClaimList{}, append(opts, client.InNamespace(ns))...)
	Expect(err).NotTo(HaveOccurred())
	return w
}

// watchClient is the client the benchmarks watch through, made once.
func (e *Env) watchClient() client.WithWatch {
	e.watchOnce.Do(func() {
		var err error
		e.watcher, err = client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
		Expect(err).NotTo(HaveOccurred())
	})
	return e.watcher
}

// Until returns the time from start until the claim's condition typ is
// True, then or earlier.
func (c *ClaimWatch) Until(start time.Time, typ string) time.Duration {
	if c.last != nil && meta.IsStatusConditionTrue(c.last.Status.Conditions, typ) {
		return time.Since(start)
	}
	timeout := time.After(Timeout)
	for {
		select {
		case ev, ok := <-c.w.ResultChan():
			Expect(ok).To(BeTrue(), "the watch ended before %s", typ)
			if claim, isClaim := ev.Object.(*v1alpha1.SessionClaim); isClaim {
				c.last = claim
				if meta.IsStatusConditionTrue(claim.Status.Conditions, typ) {
					return time.Since(start)
				}
			}
		case <-timeout:
			Fail(fmt.Sprintf("the claim was not %s within %s", typ, Timeout))
		}
	}
}

// Stop ends the watch.
func (c *ClaimWatch) Stop() { c.w.Stop() }
