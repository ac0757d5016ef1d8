//go:build e2e

package containerd_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	containerdclient "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// The benchmark is opt-in: SANDBOX_BENCH_OUT names the page it writes
// into (make bench-containerd: docs/benchmarks-containerd.md), and
// SANDBOX_BENCH_N sets the samples per figure (default 30). Without it the
// spec does not exist, so a normal run neither runs nor skips it.
var _ = func() bool {
	if testenv.BenchOut() == "" {
		return false
	}
	Describe("containerd benchmark", Label("bench"), Serial, func() {
		It("measures claim → Ready cold and hot, and exec, each beside the raw client", benchmark)
	})
	return true
}()

func benchmark() {
	n := 30
	if v, err := strconv.Atoi(os.Getenv("SANDBOX_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	var rows []testharness.BenchRow

	cold, hotBound, hotReady := claimLatencies(n)
	rawStart := rawCreateStart(n)
	driverStart := driverEnsureCold(n)
	floor := env.APIRoundTrips(n)
	rows = append(rows,
		testharness.BenchRow{What: "cold claim → Ready (container made and started)", Ours: cold, Baseline: "raw client create+start", Base: rawStart},
		testharness.BenchRow{What: "driver Ensure, cold (no controller)", Ours: driverStart, Baseline: "raw client create+start", Base: rawStart},
		testharness.BenchRow{What: "hot claim → Bound (container already running)", Ours: hotBound, Baseline: "API server create+read of an object", Base: floor},
		testharness.BenchRow{What: "hot claim → Ready", Ours: hotReady, Baseline: "API server create+read of an object", Base: floor},
	)
	ours, raw := execLatencies(n * 2)
	rows = append(rows, testharness.BenchRow{What: "exec `true` through the driver (policy, env, stdio)", Ours: ours, Baseline: "raw client exec of `true`", Base: raw})

	table := testharness.RenderTable(rows) + fmt.Sprintf("\n%d samples per claim figure, %d per exec figure; claim conditions observed through a watch. %s\n", n, 2*n, testenv.MachineNote())
	AddReportEntry("containerd benchmark", table)
	fmt.Fprintln(GinkgoWriter, table)
	Expect(testenv.WriteBenchTable(testenv.BenchOut(), "bench-containerd", table)).To(Succeed())
}

// claimLatencies: cold is a claim on a Sandbox whose container does not
// exist yet; hot is a further claim on a Sandbox already running.
func claimLatencies(n int) (cold, hotBound, hotReady []time.Duration) {
	ns := env.NewNamespace()
	for i := range n {
		name := fmt.Sprintf("cold-%d", i)
		sb := newSandbox(ns, name, "bench-"+name, time.Minute)
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Eventually(env.SandboxStatus(ns, name), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))

		w := env.WatchClaim(ns, name)
		start := time.Now()
		Expect(k8s.Create(ctx, newClaim(ns, name, name))).To(Succeed())
		cold = append(cold, w.Until(start, v1alpha1.ConditionReady))
		w.Stop()

		if i == 0 {
			// The first Sandbox stays up for the hot figures.
			continue
		}
		env.DeleteAndWait(sb)
	}
	for i := range n {
		name := fmt.Sprintf("hot-%d", i)
		w := env.WatchClaim(ns, name)
		start := time.Now()
		Expect(k8s.Create(ctx, newClaim(ns, name, "cold-0"))).To(Succeed())
		hotBound = append(hotBound, w.Until(start, v1alpha1.ConditionBound))
		hotReady = append(hotReady, w.Until(start, v1alpha1.ConditionReady))
		w.Stop()
	}
	var sb v1alpha1.Sandbox
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cold-0"}, &sb)).To(Succeed())
	env.DeleteAndWait(&sb)
	return cold, hotBound, hotReady
}

// rawCreateStart is the floor of a cold claim: the client making a
// container from the same image with the same init, and starting it.
func rawCreateStart(n int) []time.Duration {
	c, err := drv.Client()
	Expect(err).NotTo(HaveOccurred())
	nsCtx := namespaces.WithNamespace(ctx, e2eNamespace)
	img, err := c.GetImage(nsCtx, image)
	Expect(err).NotTo(HaveOccurred())
	var out []time.Duration
	for i := range n {
		id := fmt.Sprintf("bench-raw-%d", i)
		start := time.Now()
		cont, err := c.NewContainer(nsCtx, id, containerdclient.WithNewSnapshot(id, img),
			containerdclient.WithNewSpec(oci.WithDefaultPathEnv, oci.WithProcessArgs("sleep", "infinity")))
		Expect(err).NotTo(HaveOccurred())
		task, err := cont.NewTask(nsCtx, cio.NullIO)
		Expect(err).NotTo(HaveOccurred())
		_, err = task.Wait(nsCtx)
		Expect(err).NotTo(HaveOccurred())
		Expect(task.Start(nsCtx)).To(Succeed())
		out = append(out, time.Since(start))

		_, err = task.Delete(nsCtx, containerdclient.WithProcessKill)
		Expect(err).NotTo(HaveOccurred())
		Expect(cont.Delete(nsCtx, containerdclient.WithSnapshotCleanup)).To(Succeed())
	}
	return out
}

// driverEnsureCold is the driver's share of a cold claim: Ensure of an
// instance with no container yet, with no controller or API server involved.
func driverEnsureCold(n int) []time.Duration {
	// Their owner does not exist: no orphan collector may run meanwhile.
	mgr.Stop()
	defer func() { mgr = startManager() }()
	var out []time.Duration
	for i := range n {
		spec := &v1alpha1.SandboxSpec{Agent: fmt.Sprintf("bench-driver-%d", i), Backend: v1alpha1.BackendContainerd,
			Binaries: []v1alpha1.BinaryName{"true"}, Containerd: &v1alpha1.ContainerdSpec{Image: image}}
		in, err := testharness.DescribeAs(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "driver"}, Spec: *spec}, instance.Host{AreasRoot: env.AreasRoot})
		Expect(err).NotTo(HaveOccurred())
		start := time.Now()
		_, err = drv.Ensure(ctx, in)
		out = append(out, time.Since(start))
		Expect(err).NotTo(HaveOccurred())
		Expect(drv.Delete(ctx, in.Name)).To(Succeed())
	}
	return out
}

// execLatencies runs `true` alternately through the driver and through the
// bare client (load container, load task, exec, wait, start, collect,
// delete) in one running container, so both see the same load.
func execLatencies(n int) (ours, raw []time.Duration) {
	ns := env.NewNamespace()
	sb := newSandbox(ns, "exec", "bench-exec", time.Minute)
	Expect(k8s.Create(ctx, sb)).To(Succeed())
	Expect(k8s.Create(ctx, newClaim(ns, "held", "exec"))).To(Succeed())
	Eventually(env.SandboxStatus(ns, "exec"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
	inst := v1alpha1.InstanceName("bench-exec")
	c, err := drv.Client()
	Expect(err).NotTo(HaveOccurred())
	nsCtx := namespaces.WithNamespace(ctx, e2eNamespace)

	for i := range n + 5 {
		start := time.Now()
		st, err := drv.Exec(ctx, inst, runtimes.ExecRequest{Argv: []string{"true"}, Stdout: &strings.Builder{}, Stderr: &strings.Builder{}})
		took := time.Since(start)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Code).To(Equal(0))

		start = time.Now()
		rawExecTrue(c, nsCtx, inst, i)
		rawTook := time.Since(start)
		if i >= 5 { // the first few warm both paths up
			ours, raw = append(ours, took), append(raw, rawTook)
		}
	}
	env.DeleteAndWait(sb)
	return ours, raw
}

func rawExecTrue(c *containerdclient.Client, nsCtx context.Context, inst string, i int) {
	cont, err := c.LoadContainer(nsCtx, inst)
	Expect(err).NotTo(HaveOccurred())
	spec, err := cont.Spec(nsCtx)
	Expect(err).NotTo(HaveOccurred())
	task, err := cont.Task(nsCtx, nil)
	Expect(err).NotTo(HaveOccurred())
	p := *spec.Process
	p.Args = []string{"true"}
	proc, err := task.Exec(nsCtx, fmt.Sprintf("bench-raw-%d", i), &p,
		cio.NewCreator(cio.WithStreams(nil, &strings.Builder{}, &strings.Builder{}), cio.WithFIFODir(os.Getenv(testenv.ContainerdFIFODirEnv))))
	Expect(err).NotTo(HaveOccurred())
	exited, err := proc.Wait(nsCtx)
	Expect(err).NotTo(HaveOccurred())
	Expect(proc.Start(nsCtx)).To(Succeed())
	st := <-exited
	Expect(st.ExitCode()).To(BeZero())
	proc.IO().Wait()
	_, err = proc.Delete(nsCtx)
	if err != nil {
		_ = proc.Kill(nsCtx, syscall.SIGKILL)
	}
	Expect(err).NotTo(HaveOccurred())
}
