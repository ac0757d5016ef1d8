package bwrap

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// benchRuns is how many times each way of running `true` is measured.
const benchRuns = 300

// latencyModes are the three ways of running `true` that are compared, all
// with the same instance.
type latencyModes struct {
	rt   *Runtime
	in   runtimes.Instance
	args []string
	bin  string
}

func newLatencyModes(tb testing.TB) latencyModes {
	tb.Helper()
	testenv.Binary(tb, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := tb.TempDir()
	rt, err := New(Config{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		tb.Fatal(err)
	}
	// Before the directory goes: its trees are mounts on the host.
	tb.Cleanup(func() {
		if err := DetachTrees(filepath.Join(dir, "state")); err != nil {
			tb.Error(err)
		}
	})
	spec := &v1alpha1.SandboxSpec{Agent: "bench", Binaries: []v1alpha1.BinaryName{"true"}}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		tb.Fatal(err)
	}
	c, err := rt.prepare(in, runtimes.ExecRequest{Argv: []string{"true"}}, false)
	if err != nil {
		tb.Fatal(err)
	}
	// The areas as Exec binds them: from the instance's mount tree.
	if err := rt.treeAreas(in, &c); err != nil {
		tb.Fatal(err)
	}
	bwrapPath, err := exec.LookPath(rt.bwrap)
	if err != nil {
		tb.Fatal(err)
	}
	return latencyModes{rt: rt, in: in, args: rt.Args(in, c), bin: bwrapPath}
}

func (m latencyModes) ours(tb testing.TB) {
	st, err := m.rt.Exec(context.Background(), m.in.Name, runtimes.ExecRequest{Argv: []string{"true"}})
	if err != nil || st.Code != 0 {
		tb.Fatalf("policy + bwrap backend: %v, exit %d", err, st.Code)
	}
}

func (m latencyModes) rawBwrap(tb testing.TB) {
	// The same process setup as Exec's (no output streams, own process
	// group, the agent's identity), so that only the policy and the driver
	// differ.
	cmd := exec.Command(m.bin, m.args...)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if id := m.in.Identity; id.UID != 0 && uint32(os.Geteuid()) != id.UID {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: []uint32{}}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("bwrap with the same flags: %v: %s", err, out)
	}
}

func (m latencyModes) direct(tb testing.TB) {
	if err := exec.Command("/bin/true").Run(); err != nil {
		tb.Fatalf("direct fork/exec: %v", err)
	}
}

func BenchmarkExecTrue(b *testing.B) {
	m := newLatencyModes(b)
	for _, c := range []struct {
		name string
		run  func(testing.TB)
	}{{"policy+bwrap", m.ours}, {"bwrap-same-flags", m.rawBwrap}, {"fork-exec", m.direct}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				c.run(b)
			}
		})
	}
}

// BenchmarkLatencyTable measures the three modes interleaved, so that
// drift in the machine's load hits them alike, and writes the table to the
// page SANDBOX_BENCH_OUT names (make bench-bwrap: docs/benchmarks-bwrap.md),
// else to the log.
func BenchmarkLatencyTable(t *testing.B) {
	out := testenv.BenchOut()
	m := newLatencyModes(t)
	modes := []struct {
		name string
		run  func(testing.TB)
		d    []time.Duration
	}{
		{name: "policy + bwrap backend (`Runtime.Exec`)", run: m.ours},
		{name: "bwrap invoked directly, same flags", run: m.rawBwrap},
		{name: "direct fork/exec of `true`", run: m.direct},
	}
	for range 10 {
		for i := range modes {
			modes[i].run(t)
		}
	}
	for range benchRuns {
		for i := range modes {
			start := time.Now()
			modes[i].run(t)
			modes[i].d = append(modes[i].d, time.Since(start))
		}
	}
	med := func(d []time.Duration) time.Duration { return quantile(d, 0.5) }
	p99 := func(d []time.Duration) time.Duration { return quantile(d, 0.99) }
	ours, raw, direct := modes[0].d, modes[1].d, modes[2].d

	var b strings.Builder
	fmt.Fprintf(&b, "| how `true` runs | median | p99 | median vs raw bwrap |\n| --- | ---: | ---: | ---: |\n")
	for _, md := range modes {
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f× |\n", md.name, ms(med(md.d)), ms(p99(md.d)), float64(med(md.d))/float64(med(raw)))
	}
	overhead := float64(med(ours))/float64(med(raw)) - 1
	verdict := "within"
	if overhead > 0.10 {
		verdict = "over"
	}
	fmt.Fprintf(&b, "\nOverhead of the policy and the driver over raw bwrap: **%+.1f%%** at the median "+
		"(%s per command), %s the 10%% goal. The sandbox itself costs %.1f× a direct fork/exec.\n",
		overhead*100, ms(med(ours)-med(raw)), verdict, float64(med(raw))/float64(med(direct)))
	fmt.Fprintf(&b, "\n%d runs of each, interleaved, after 10 warm-up runs. %s\n", benchRuns, testenv.MachineNote())
	if out == "" {
		t.Logf("%s is not set, so the table is not written:\n%s", testenv.BenchOutEnv, b.String())
		return
	}
	if err := testenv.WriteBenchTable(out, "bench-bwrap", b.String()); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, b.String())
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
