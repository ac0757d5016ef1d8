package controllers_test

import (
	"fmt"
	"os"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// The claim benchmark of the default backend is opt-in: SANDBOX_BENCH_OUT
// names the page its table goes into (`make bench-claims` sets it),
// SANDBOX_BENCH_N the samples of the one-at-a-time figures (default 30) and
// SANDBOX_BENCH_BURST the size of a burst (default 100). Without it the
// spec does not exist, so a normal run neither runs nor skips it.
var _ = func() bool {
	if testenv.BenchOut() == "" {
		return false
	}
	Describe("claim benchmark (bwrap)", Label("bench"), Serial, func() {
		It("measures claims one at a time and in bursts beside API server round trips", claimBenchmark)
	})
	return true
}()

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func claimBenchmark() {
	n, burst := max(envInt("SANDBOX_BENCH_N", 30), 2), envInt("SANDBOX_BENCH_BURST", 100)
	// The floors are sampled beside the claims, one of each before each
	// claim, so that a ratio compares moments of the same load: the floor
	// taken all at once before the claims moved by half between runs.
	floorNS := newNamespace()
	var floor []time.Duration
	floorSample := func(what string, i int) {
		floor = append(floor, env.APIRoundTrip(floorNS, fmt.Sprintf("%s-%d", what, i)))
	}
	answerer := env.StartAnswerer()
	defer answerer.Stop()

	ns := newNamespace()
	writes := mgr.Writes
	var cold, hotBound, hotReady, answered []time.Duration
	// The controller's writes before each cold claim, of its Sandbox.
	sandboxBefore := make([]int, n)
	for i := range n {
		name := fmt.Sprintf("cold-%d", i)
		Expect(k8s.Create(ctx, newSandbox(ns, name, ns+"-"+name, time.Minute))).To(Succeed())
		Eventually(sandboxStatus(ns, name), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		sandboxBefore[i] = writes.Of("sandboxes", ns, name)
		floorSample("cold", i)
		w := env.WatchClaim(ns, name)
		start := time.Now()
		Expect(k8s.Create(ctx, newClaim(ns, name, name))).To(Succeed())
		cold = append(cold, w.Until(start, v1alpha1.ConditionReady))
		w.Stop()
	}
	hotBefore := writes.Of("sandboxes", ns, "cold-0") + writes.Of("sessionclaims", ns, "cold-0")
	// The twin answers with the status of a Ready claim on this Sandbox.
	var ready v1alpha1.SessionClaim
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cold-0"}, &ready)).To(Succeed())
	twin := env.StartClaimTwin(ready.Status)
	defer twin.Stop()
	var twinned []time.Duration
	for i := range n {
		name := fmt.Sprintf("hot-%d", i)
		floorSample("hot", i)
		answered = append(answered, answerer.Sample(name))
		twinned = append(twinned, twin.Sample(name, "cold-0"))
		w := env.WatchClaim(ns, name)
		start := time.Now()
		Expect(k8s.Create(ctx, newClaim(ns, name, "cold-0"))).To(Succeed())
		hotBound = append(hotBound, w.Until(start, v1alpha1.ConditionBound))
		hotReady = append(hotReady, w.Until(start, v1alpha1.ConditionReady))
		w.Stop()
	}
	// Writes a claim: once every Sandbox counts its claims and the
	// controller has gone quiet, the writes of each cold claim and of its
	// Sandbox since the claim (cold-0 left out: the hot claims share it),
	// and those of the hot claims and of the Sandbox they share.
	Eventually(sandboxStatus(ns, "cold-0"), timeout).Should(sandboxIs(int32(n+1), metav1.ConditionTrue, v1alpha1.ReasonRunning))
	for i := 1; i < n; i++ {
		Eventually(sandboxStatus(ns, fmt.Sprintf("cold-%d", i)), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
	}
	quiet(writes, ns)
	coldWrites := 0
	for i := 1; i < n; i++ {
		name := fmt.Sprintf("cold-%d", i)
		coldWrites += writes.Of("sessionclaims", ns, name) + writes.Of("sandboxes", ns, name) - sandboxBefore[i]
	}
	hotWrites := writes.Total("sessionclaims", ns, "hot-") + writes.Of("sandboxes", ns, "cold-0") + writes.Of("sessionclaims", ns, "cold-0") - hotBefore
	perClaim := fmt.Sprintf("API writes a claim (the controller's requests that change the claim or its Sandbox, counted once it is quiet): %.1f on a stopped Sandbox, %.1f on a running one.",
		float64(coldWrites)/float64(n-1), float64(hotWrites)/float64(n))

	crdFloor := claimRoundTrips(n)
	apiBurst := env.APIBurst(burst)
	coldBurst := claimBurst(burst, true)
	sharedBurst := claimBurst(burst, false)

	table := testharness.RenderTable([]testharness.BenchRow{
		{What: "cold claim → Ready (Sandbox stopped)", Ours: cold, Baseline: "API server create+read", Base: floor},
		{What: "hot claim → Bound (Sandbox running)", Ours: hotBound, Baseline: "API server create+read", Base: floor},
		{What: "hot claim → Ready (Sandbox running)", Ours: hotReady, Baseline: "API server create+read", Base: floor},
		{What: "a bare watcher's one write in answer → seen (the floor of any controller's answer)", Ours: answered, Baseline: "API server create+read", Base: floor},
		{What: "hot claim → Ready (Sandbox running)", Ours: hotReady, Baseline: "a bare watcher's answer", Base: answered},
		{What: "a bare watcher's status write on a new SessionClaim twin → seen (the API server's part of a hot claim)", Ours: twinned, Baseline: "API server create+read", Base: floor},
		{What: "hot claim → Ready (Sandbox running)", Ours: hotReady, Baseline: "the API server's part of a hot claim", Base: twinned},
		{What: "SessionClaim create+read, of no Sandbox (what our CRD costs the API server)", Ours: crdFloor, Baseline: "API server create+read", Base: floor},
		{What: fmt.Sprintf("burst of %d claims, one Sandbox each → Ready", burst), Ours: coldBurst,
			Baseline: fmt.Sprintf("%d concurrent create+read", burst), Base: apiBurst},
		{What: fmt.Sprintf("burst of %d claims on one running Sandbox → Ready", burst), Ours: sharedBurst,
			Baseline: fmt.Sprintf("%d concurrent create+read", burst), Base: apiBurst},
	})
	table += "\n" + perClaim + "\n\nThe create+read and the bare watcher's answer are sampled beside the claims, one of each before each claim. The bare watcher answers a new ConfigMap of its own namespace with one write: a claim on a running Sandbox needs at least that, its status being a write of the controller's after the claim's. The SessionClaim twin is our SessionClaim CRD (its schema, validation rules and status subresource) under a group no controller watches; a bare watcher answers each new one with one status write of the status the controller wrote for a Ready claim on the same Sandbox, so the twin's figure is what the API server alone needs for a hot claim, and the ratio of a hot claim to it is the controller's own share. A burst figure's samples are each claim's time from the burst's start; its p99 is the whole burst. Conditions observed through a watch. " + testenv.MachineNote() + "\n"
	AddReportEntry("claim benchmark (bwrap)", table)
	fmt.Fprintln(GinkgoWriter, table)
	Expect(testenv.WriteBenchTable(testenv.BenchOut(), "bench-claims", table)).To(Succeed())
}

// claimRoundTrips is the floor of the claim figures with our own CRD in
// place of a ConfigMap: a SessionClaim created and read back, n times one
// at a time. Its Sandbox does not exist; the controller's answer to that
// (one status write) comes after the read, or beside it.
func claimRoundTrips(n int) []time.Duration {
	ns := newNamespace()
	out := make([]time.Duration, 0, n)
	for i := range n {
		c := newClaim(ns, fmt.Sprintf("floor-%d", i), "none")
		start := time.Now()
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(c), &v1alpha1.SessionClaim{})).To(Succeed())
		out = append(out, time.Since(start))
	}
	return out
}

// quiet waits until the controller has written nothing in namespace ns
// for half a second.
func quiet(writes *testharness.Writes, ns string) {
	total := func() int { return writes.Total("sandboxes", ns, "") + writes.Total("sessionclaims", ns, "") }
	last := total()
	Eventually(func() bool {
		time.Sleep(500 * time.Millisecond)
		now := total()
		settled := now == last
		last = now
		return settled
	}, timeout).Should(BeTrue())
}

// claimBurst creates burst claims at once: each on a Sandbox of its own
// (stopped, made beforehand) when cold, else all on one running Sandbox.
func claimBurst(burst int, cold bool) []time.Duration {
	ns := newNamespace()
	var claims []*v1alpha1.SessionClaim
	if !cold {
		Expect(k8s.Create(ctx, newSandbox(ns, "shared", ns+"-shared", time.Minute))).To(Succeed())
		Expect(k8s.Create(ctx, newClaim(ns, "holder", "shared"))).To(Succeed())
		Eventually(sandboxStatus(ns, "shared"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
	}
	for i := range burst {
		name := fmt.Sprintf("b-%d", i)
		target := "shared"
		if cold {
			target = name
			Expect(k8s.Create(ctx, newSandbox(ns, name, ns+"-"+name, time.Minute))).To(Succeed())
		}
		claims = append(claims, newClaim(ns, name, target))
	}
	if cold {
		Eventually(func() int {
			var list v1alpha1.SandboxList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			stopped := 0
			for _, sb := range list.Items {
				if c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Reason == v1alpha1.ReasonStopped {
					stopped++
				}
			}
			return stopped
		}, timeout).Should(Equal(burst))
	}
	return env.ClaimBurst(claims)
}
