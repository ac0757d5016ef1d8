package framework

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
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// PollEvery is how often a benchmark reads status: the resolution of its
// claim figures.
const PollEvery = time.Millisecond

// WaitFor polls cond and returns how long it took from start.
func WaitFor(start time.Time, cond func() bool) time.Duration {
	deadline := start.Add(Timeout)
	for !cond() {
		Expect(time.Now().Before(deadline)).To(BeTrue(), "the condition did not hold within %s", Timeout)
		time.Sleep(PollEvery)
	}
	return time.Since(start)
}

// ClaimCondition says whether a claim's condition typ is True, read
// straight from the API server.
func (e *Env) ClaimCondition(ns, name, typ string) func() bool {
	return func() bool {
		var c v1alpha1.SessionClaim
		if err := e.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &c); err != nil {
			return false
		}
		return meta.IsStatusConditionTrue(c.Status.Conditions, typ)
	}
}

// APIRoundTrips is the floor of a claim figure: writing an object and
// reading it back, with no controller in between.
func (e *Env) APIRoundTrips(n int) []time.Duration {
	ns := e.NewNamespace()
	var out []time.Duration
	for i := range n {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("floor-%d", i)}}
		start := time.Now()
		Expect(e.Client.Create(context.Background(), cm)).To(Succeed())
		Expect(e.Client.Get(context.Background(), client.ObjectKeyFromObject(cm), &corev1.ConfigMap{})).To(Succeed())
		out = append(out, time.Since(start))
	}
	return out
}

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

// Burst creates the objects concurrently at one start and returns, for
// each, the time from that start until ready(it) holds; ready is checked
// for all of them by one List every pollEvery.
func (e *Env) Burst(objs []client.Object, list func() map[string]bool, pollEvery time.Duration) []time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for _, o := range objs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			Expect(e.Client.Create(context.Background(), o)).To(Succeed())
		}()
	}
	out := map[string]time.Duration{}
	deadline := start.Add(Timeout)
	for len(out) < len(objs) {
		Expect(time.Now().Before(deadline)).To(BeTrue(), "%d of %d ready within %s", len(out), len(objs), Timeout)
		ready := list()
		now := time.Since(start)
		for _, o := range objs {
			if _, seen := out[o.GetName()]; !seen && ready[o.GetName()] {
				out[o.GetName()] = now
			}
		}
		time.Sleep(pollEvery)
	}
	wg.Wait()
	ds := make([]time.Duration, 0, len(out))
	for _, d := range out {
		ds = append(ds, d)
	}
	return ds
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
