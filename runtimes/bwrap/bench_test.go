package bwrap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/instance"
	"github.com/cireilclaw/sandbox-controller/internal/testenv"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// benchTableEnv names the file TestLatencyTable writes; unset, the table is
// not measured (it takes a while and is not a test of behaviour).
const benchTableEnv = "SANDBOX_BENCH_TABLE"

// otherTables ends the table file with where the other measurements are.
const otherTables = "\n## The other backends and the exec API\n\nEach has its own table, written by its own make target with its baseline measured in the same run:\n\n- containerd: claim \u2192 Ready cold and hot, exec, beside the raw client ([benchmarks-containerd.md](benchmarks-containerd.md), `make bench-containerd`)\n- incus: claim \u2192 Ready cold and hot, exec, beside raw REST calls and the incus CLI ([benchmarks-incus.md](benchmarks-incus.md), `make bench-incus`)\n- exec API: exec of `true` through the API beside the runtime called directly ([benchmarks-execapi.md](benchmarks-execapi.md), `make bench-execapi`)\n"

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
	// group), so that only the policy and the driver differ.
	cmd := exec.Command(m.bin, m.args...)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Run(); err != nil {
		tb.Fatalf("bwrap with the same flags: %v", err)
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
// file SANDBOX_BENCH_TABLE names (make bench-bwrap), else to the log.
func BenchmarkLatencyTable(t *testing.B) {
	out := os.Getenv(benchTableEnv)
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
	b.WriteString(benchHeader)
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
	fmt.Fprintf(&b, "\n%d runs of each, interleaved, after 10 warm-up runs; measured %s.\n\nMachine: %s.\n",
		benchRuns, time.Now().UTC().Format("2006-01-02"), machineNote())
	b.WriteString(otherTables)
	if out == "" {
		t.Logf("%s is not set, so the table is not written:\n%s", benchTableEnv, b.String())
		return
	}
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, b.String())
}

const benchHeader = `# Benchmarks

## Per-command latency of the bwrap backend

What one command costs, measured by ` + "`make bench`" + ` (` + "`TestLatencyTable`" + ` in
runtimes/bwrap; ` + "`go test -bench ExecTrue ./runtimes/bwrap/`" + ` gives the same three
as Go benchmarks). The command is ` + "`true`" + `, so the numbers are pure overhead:

- **policy + bwrap backend**: ` + "`Runtime.Exec`" + ` as the controller and sandboxctl call
  it: the instance record is read, argv is checked against the allowlist,
  workspace/.env is read through the openat2-contained access, the
  environment is rebuilt, the bwrap arguments are built and bwrap runs.
- **bwrap invoked directly, same flags**: the identical argument list, built
  once beforehand, run with os/exec.
- **direct fork/exec**: ` + "`true`" + ` run with os/exec, no sandbox.

`

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// machineNote describes the machine without naming anything of its file
// system.
func machineNote() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = "Linux " + strings.TrimSpace(string(b))
	}
	bw := "bubblewrap"
	if out, err := exec.Command("bwrap", "--version").Output(); err == nil {
		bw = strings.TrimSpace(string(bytes.TrimSpace(out)))
	}
	return fmt.Sprintf("%s, %d cores visible, %s, %s, %s, running as uid %d; the cores were shared with other work, so p99 carries its noise",
		cpu, runtime.NumCPU(), kernel, bw, runtime.Version(), os.Getuid())
}
