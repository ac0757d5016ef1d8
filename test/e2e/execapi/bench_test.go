package execapi_test

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// benchmarkExec runs `true` alternately through the API, through the API
// server (the aggregated API, when kube is a kubeconfig's configuration
// for it) and through the driver in this process, so all see the same
// machine load, and writes p50 and p99 of each to out.
// apart is the pause before each command of the rows that come apart.
const apart = 50 * time.Millisecond

func benchmarkExec(out string, cfg, kube *rest.Config, ns, claim, instance string) {
	n := 200
	if v, err := strconv.Atoi(os.Getenv("SANDBOX_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	// A server configured as the controller runs it: claims read through
	// the manager's cache, authentication and authorisation answers cached
	// for the default time.
	_, restore := serveInstead(mgr.Client, execapi.DefaultAuthCacheTTL, nil)
	defer restore()

	if kube != nil {
		installAggregatedAPI()
		routeTo(aggAPI)
		Eventually(func() error { return execThrough(ctx, kube, ns, claim, "true").err }, timeout).Should(Succeed())
	}
	rt := mgr.Runtimes[v1alpha1.BackendBwrap]
	var viaAPI, viaServer, direct []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		res := execIn(ctx, cfg, ns, claim, nil, nil, "true")
		viaAPI = append(viaAPI, time.Since(t0))
		Expect(res.err).NotTo(HaveOccurred())

		if kube != nil {
			t0 = time.Now()
			res = execThrough(ctx, kube, ns, claim, "true")
			viaServer = append(viaServer, time.Since(t0))
			Expect(res.err).NotTo(HaveOccurred())
		}

		t0 = time.Now()
		st, err := rt.Exec(ctx, instance, runtimes.ExecRequest{Argv: []string{"true"}})
		direct = append(direct, time.Since(t0))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Code).To(Equal(0))
	}
	// An agent's commands come apart, not back to back: the same two
	// paths again, each command 50 ms after the last. (On cgroup v1 a
	// start that moves a process into a cgroup right after another move
	// is spared the RCU grace period a lone one waits for.)
	var apiApart, directApart []time.Duration
	for i := 0; i < max(n/2, 20); i++ {
		time.Sleep(apart)
		t0 := time.Now()
		res := execIn(ctx, cfg, ns, claim, nil, nil, "true")
		apiApart = append(apiApart, time.Since(t0))
		Expect(res.err).NotTo(HaveOccurred())

		time.Sleep(apart)
		t0 = time.Now()
		_, err := rt.Exec(ctx, instance, runtimes.ExecRequest{Argv: []string{"true"}})
		directApart = append(directApart, time.Since(t0))
		Expect(err).NotTo(HaveOccurred())
	}
	p := func(d []time.Duration, q float64) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(q*float64(len(s)-1))]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
	var b strings.Builder
	fmt.Fprintf(&b, "| path | p50 | p99 |\n| --- | ---: | ---: |\n")
	fmt.Fprintf(&b, "| through the exec API (the node's endpoint) | %s | %s |\n", ms(p(viaAPI, 0.5)), ms(p(viaAPI, 0.99)))
	if kube != nil {
		fmt.Fprintf(&b, "| through the API server (aggregated API) | %s | %s |\n", ms(p(viaServer, 0.5)), ms(p(viaServer, 0.99)))
	}
	fmt.Fprintf(&b, "| runtime called directly (baseline) | %s | %s |\n", ms(p(direct, 0.5)), ms(p(direct, 0.99)))
	fmt.Fprintf(&b, "| exec API overhead | %s | %s |\n", ms(p(viaAPI, 0.5)-p(direct, 0.5)), ms(p(viaAPI, 0.99)-p(direct, 0.99)))
	if kube != nil {
		fmt.Fprintf(&b, "| API server's added cost over the node's endpoint | %s | %s |\n", ms(p(viaServer, 0.5)-p(viaAPI, 0.5)), ms(p(viaServer, 0.99)-p(viaAPI, 0.99)))
	}
	fmt.Fprintf(&b, "| through the exec API, %v after the last command | %s | %s |\n", apart, ms(p(apiApart, 0.5)), ms(p(apiApart, 0.99)))
	fmt.Fprintf(&b, "| runtime called directly, %v after the last command | %s | %s |\n", apart, ms(p(directApart, 0.5)), ms(p(directApart, 0.99)))
	fmt.Fprintf(&b, "\n%d runs of each of the first rows, interleaved in one process; %d of each of the last two, %v apart. %s\n", n, len(apiApart), apart, testenv.MachineNote())
	Expect(testenv.WriteBenchTable(out, "bench-execapi", b.String())).To(Succeed())
	fmt.Fprint(GinkgoWriter, b.String())
}
