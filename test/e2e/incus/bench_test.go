//go:build e2e

package incus_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// The latency table of docs/benchmarks-incus.md: each path through the
// controller beside the raw REST calls that do the same work on incusd,
// measured interleaved in the same run. It runs only when
// SANDBOX_BENCH_OUT names the page to write into (make bench-incus).
var _ = Describe("Incus latency", Label("bench"), func() {
	out := testenv.BenchOut()
	if out == "" {
		return
	}
	It("measures claim → Ready cold and hot, and exec of true, beside the raw REST baseline", func() {
		const lifecycleRuns, execRuns = 7, 60
		ns := env.NewNamespace()
		var rows []benchRow

		By("claim → Ready with the instance absent (create, start, account setup)")
		var cold, coldRaw []time.Duration
		for i := range lifecycleRuns {
			cold = append(cold, claimToReady(ns, fmt.Sprintf("cold%d", i), true))
			coldRaw = append(coldRaw, rawCreateStart(ns, fmt.Sprintf("rawcold%d", i)))
		}
		rows = append(rows,
			benchRow{"claim → Ready, instance absent (controller: create + start + account setup)", cold, coldRaw},
			benchRow{"raw REST: POST /1.0/instances (start: true) + wait, same devices and raw.idmap", coldRaw, coldRaw})

		By("claim → Ready with the instance stopped (start, account check)")
		sb := newSandbox(ns, "hot")
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		var hot, hotRaw []time.Duration
		raw := rawStoppedInstance(ns, "rawhot")
		// The first claim creates the instance; only the later ones are hot.
		claimToReady(ns, "hot", false, "create")
		for i := range lifecycleRuns {
			hot = append(hot, claimToReady(ns, "hot", false, fmt.Sprintf("h%d", i)))
			hotRaw = append(hotRaw, rawStart(raw))
		}
		rows = append(rows,
			benchRow{"claim → Ready, instance stopped (controller: start + account check)", hot, hotRaw},
			benchRow{"raw REST: PUT /1.0/instances/{name}/state start + wait", hotRaw, hotRaw})

		By("the driver alone: Runtime.Ensure with the instance absent, then stopped")
		var drvCold, drvHot []time.Duration
		for i := range lifecycleRuns {
			in := driverInstance(ns, fmt.Sprintf("drv%d", i))
			t0 := time.Now()
			_, err := driver.Ensure(ctx, in)
			drvCold = append(drvCold, time.Since(t0))
			Expect(err).NotTo(HaveOccurred())
			Expect(driver.Stop(ctx, in.Name)).To(Succeed())
			t0 = time.Now()
			_, err = driver.Ensure(ctx, in)
			drvHot = append(drvHot, time.Since(t0))
			Expect(err).NotTo(HaveOccurred())
			Expect(driver.Delete(ctx, in.Name)).To(Succeed())
		}
		rows = append(rows,
			benchRow{"driver alone: `Runtime.Ensure`, instance absent", drvCold, coldRaw},
			benchRow{"driver alone: `Runtime.Ensure`, instance stopped", drvHot, hotRaw})

		By("exec of true")
		var drv, rest, cli []time.Duration
		name := instanceOf(sb)
		Expect(k8s.Create(ctx, newClaim(ns, "hold", "hot"))).To(Succeed())
		Eventually(sandboxStatus(ns, "hot"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		id := agentID(sb)
		direct := incusapi.ExecRequest{Command: []string{"true"}, Env: map[string]string{"PATH": "/bin", "HOME": "/workspace"}, User: id.UID, Group: id.GID, Cwd: "/workspace"}
		incusCLI, cliErr := exec.LookPath("incus")
		for i := range execRuns + 5 {
			t0 := time.Now()
			st, err := driver.Exec(ctx, name, runtimes.ExecRequest{Argv: []string{"true"}})
			d1 := time.Since(t0)
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Code).To(Equal(0))
			t0 = time.Now()
			code, err := rawClient().Exec(ctx, name, direct)
			d2 := time.Since(t0)
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(0))
			var d3 time.Duration
			if cliErr == nil {
				t0 = time.Now()
				Expect(exec.Command(incusCLI, "exec", name, "--user", fmt.Sprint(id.UID), "--group", fmt.Sprint(id.GID), "--cwd", "/workspace", "--", "true").Run()).To(Succeed())
				d3 = time.Since(t0)
			}
			if i < 5 {
				continue // warm-up
			}
			drv, rest = append(drv, d1), append(rest, d2)
			if cliErr == nil {
				cli = append(cli, d3)
			}
		}
		rows = append(rows,
			benchRow{"exec `true` through the driver (policy, instance lookup, websockets)", drv, rest},
			benchRow{"raw REST: POST exec + 4 websockets + operation wait (incusapi alone)", rest, rest})
		if len(cli) > 0 {
			rows = append(rows, benchRow{"`incus exec` command (for reference; includes its own start-up)", cli, rest})
		}
		Expect(writeBenchTable(out, rows, lifecycleRuns, execRuns)).To(Succeed())
		env.DeleteAndWait(sb)
	})
})

type benchRow struct {
	what     string
	samples  []time.Duration
	baseline []time.Duration
}

// claimToReady measures from a claim's creation to its Ready (its
// Sandbox's instance running), observed through a watch,
// then releases the claim and waits until the instance is stopped (or, for
// a fresh Sandbox, deletes it so the next run is cold again).
func claimToReady(ns, sandbox string, fresh bool, claimName ...string) time.Duration {
	if fresh {
		Expect(k8s.Create(ctx, newSandbox(ns, sandbox))).To(Succeed())
		Eventually(sandboxStatus(ns, sandbox), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
	}
	cn := "c"
	if len(claimName) > 0 {
		cn = claimName[0]
	}
	claim := newClaim(ns, cn, sandbox)
	w := env.WatchClaim(ns, cn)
	defer w.Stop()
	start := time.Now()
	Expect(k8s.Create(ctx, claim)).To(Succeed())
	took := w.Until(start, v1alpha1.ConditionReady)
	env.DeleteAndWait(claim)
	Eventually(sandboxStatus(ns, sandbox), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
	if fresh {
		env.DeleteAndWait(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sandbox}})
	}
	return took
}

// rawInstance is what the driver would create for a Sandbox, made with
// the REST client alone.
func rawInstance(ns, name string) incusapi.InstancesPost {
	sb := newSandbox(ns, name)
	in, err := testharness.DescribeAs(sb, instance.Host{AreasRoot: env.AreasRoot})
	Expect(err).NotTo(HaveOccurred())
	for _, a := range in.Areas {
		Expect(os.MkdirAll(a.Source, 0o755)).To(Succeed())
	}
	devs, err := incus.Devices(in)
	Expect(err).NotTo(HaveOccurred())
	return incusapi.InstancesPost{
		Name:    "bench-" + name + "-" + ns,
		Source:  incusapi.InstanceSource{Type: "image", Alias: image},
		Config:  map[string]string{"raw.idmap": incus.RawIdmap(in.Identity)},
		Devices: devs,
	}
}

// driverInstance is the description the controller would give the driver
// for a Sandbox that is not in the API server.
func driverInstance(ns, name string) runtimes.Instance {
	sb := newSandbox(ns, name)
	in, err := testharness.DescribeAs(sb, instance.Host{AreasRoot: env.AreasRoot})
	Expect(err).NotTo(HaveOccurred())
	return in
}

func rawCreateStart(ns, name string) time.Duration {
	req := rawInstance(ns, name)
	req.Start = true
	cl := rawClient()
	start := time.Now()
	Expect(cl.CreateInstance(ctx, req)).To(Succeed())
	took := time.Since(start)
	Expect(cl.SetState(ctx, req.Name, incusapi.InstanceStatePut{Action: "stop", Force: true})).To(Succeed())
	Expect(cl.DeleteInstance(ctx, req.Name)).To(Succeed())
	return took
}

func rawStoppedInstance(ns, name string) string {
	req := rawInstance(ns, name)
	Expect(rawClient().CreateInstance(ctx, req)).To(Succeed())
	DeferCleanup(func() {
		_ = rawClient().SetState(context.Background(), req.Name, incusapi.InstanceStatePut{Action: "stop", Force: true})
		Expect(rawClient().DeleteInstance(context.Background(), req.Name)).To(Succeed())
	})
	return req.Name
}

func rawStart(name string) time.Duration {
	cl := rawClient()
	start := time.Now()
	Expect(cl.SetState(ctx, name, incusapi.InstanceStatePut{Action: "start"})).To(Succeed())
	took := time.Since(start)
	Expect(cl.SetState(ctx, name, incusapi.InstanceStatePut{Action: "stop", Timeout: 10})).To(Succeed())
	return took
}

func writeBenchTable(path string, rows []benchRow, lifecycleRuns, execRuns int) error {
	srv, err := rawClient().Server(ctx)
	if err != nil {
		return err
	}
	pool, err := rawClient().GetStoragePool(ctx, "default")
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("| path | median | min | max | median vs raw REST |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		s := slices.Clone(r.samples)
		slices.Sort(s)
		ratio := float64(testharness.Percentile(r.samples, 0.5)) / float64(testharness.Percentile(r.baseline, 0.5))
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f× |\n", r.what, testharness.Ms(testharness.Percentile(s, 0.5)), testharness.Ms(s[0]), testharness.Ms(s[len(s)-1]), ratio)
	}
	fmt.Fprintf(&b, "\n%d runs of each lifecycle path and %d of each exec path (after 5 warm-up runs), interleaved; measured %s.\n\n",
		lifecycleRuns, execRuns, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Machine: %d cores visible, %s/%s, incus %s, storage pool %q (%s), busybox test image, %s, running as uid %d; the cores were shared with other work.\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, srv.Environment.ServerVersion, pool.Name, pool.Driver, runtime.Version(), os.Getuid())
	return testenv.WriteBenchTable(path, "bench-incus", b.String())
}
