package bwrap

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// benchRuns is how many times each way of running `true` is measured.
const benchRuns = 300

// spacedRuns are the one-shot samples taken 50 ms apart.
const spacedRuns = 60

// latencyModes are the three ways of running `true` that are compared, all
// with the same instance.
type latencyModes struct {
	rt   *Runtime
	in   runtimes.Instance
	args []string
	bin  string
	// oneShot is a sandboxctl binary and its arguments for `true`, a
	// whole process as a user's shell starts it.
	oneShot []string
}

func newLatencyModes(tb testing.TB) latencyModes {
	tb.Helper()
	testenv.Binary(tb, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := tb.TempDir()
	// As the controller runs it: commands start through the starter.
	rt, err := New(Config{StateDir: filepath.Join(dir, "state"), Starter: testenv.Starter(tb)})
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
	c, err := rt.prepare(in, runtimes.ExecRequest{Argv: []string{"true"}}, false, nil)
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
	return latencyModes{rt: rt, in: in, args: rt.Args(in, c), bin: bwrapPath, oneShot: buildSandboxctl(tb, dir)}
}

// buildSandboxctl builds sandboxctl into dir and returns the command line
// of a one-shot `true` with a configuration allowing it.
func buildSandboxctl(tb testing.TB, dir string) []string {
	tb.Helper()
	bin := filepath.Join(dir, "sandboxctl")
	// Static, as make install-plugin builds it.
	cmd, cancel := testenv.Command(10*time.Minute, "go", "build", "-o", bin, "github.com/cireilclaw/sandbox-controller/cmd/sandboxctl")
	defer cancel()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building sandboxctl: %v: %s", err, out)
	}
	cfg := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(cfg, []byte("[bwrap]\nbinaries = [\"true\"]\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	areas := filepath.Join(dir, "oneshot-areas")
	tb.Cleanup(func() { _ = DetachTrees(filepath.Join(areas, ".sandboxctl")) })
	return []string{bin, "run", "--config", cfg, "--agent", "oneshot", "--areas-root", areas, "--", "true"}
}

// sandboxctlRun runs `sandboxctl run -- true` as a process of its own.
func (m latencyModes) sandboxctlRun(tb testing.TB) {
	if out, err := exec.Command(m.oneShot[0], m.oneShot[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("sandboxctl run: %v: %s", err, out)
	}
}

// minimalBwrap is the least bubblewrap that runs `true`: the system
// directories read-only, /proc and /dev, every namespace unshared.
func (m latencyModes) minimalBwrap(tb testing.TB) {
	args := []string{"--ro-bind", "/usr", "/usr"}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if t, err := os.Readlink("/" + l); err == nil {
			args = append(args, "--symlink", t, "/"+l)
		} else if fi, err := os.Stat("/" + l); err == nil && fi.IsDir() {
			args = append(args, "--ro-bind", "/"+l, "/"+l)
		}
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--die-with-parent", "true")
	if out, err := exec.Command(m.bin, args...).CombinedOutput(); err != nil {
		tb.Fatalf("minimal bwrap: %v: %s", err, out)
	}
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
	type mode struct {
		name string
		run  func(testing.TB)
		d    []time.Duration
	}
	modes := []mode{
		{name: "policy + bwrap backend (`Runtime.Exec`)", run: m.ours},
		{name: "bwrap invoked directly, same flags", run: m.rawBwrap},
		{name: "direct fork/exec of `true`", run: m.direct},
		{name: "`sandboxctl run -- true`, a whole process (one-shot)", run: m.sandboxctlRun},
		{name: "minimal bwrap, a whole process (the one-shot's baseline)", run: m.minimalBwrap},
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
	// A one-shot run as a user's shell starts one: alone, the kernel's
	// state gone quiet since the last (back to back, a cgroup move of
	// the run before leaves the next one's fast).
	spaced := []mode{
		{name: "`sandboxctl run -- true`, one-shot, 50 ms after the last run", run: m.sandboxctlRun},
		{name: "minimal bwrap, 50 ms after the last run", run: m.minimalBwrap},
	}
	for range spacedRuns {
		for i := range spaced {
			time.Sleep(50 * time.Millisecond)
			start := time.Now()
			spaced[i].run(t)
			spaced[i].d = append(spaced[i].d, time.Since(start))
		}
	}
	modes = append(modes, spaced...)
	// interleave measures each of ms crowdedRuns times, one after the
	// other in turn.
	interleave := func(ms []mode) {
		for range crowdedRuns {
			for i := range ms {
				start := time.Now()
				ms[i].run(t)
				ms[i].d = append(ms[i].d, time.Since(start))
			}
		}
	}
	if m.rt.trees == "" {
		t.Fatal("the crowded rows need the driver's mount trees: run the benchmark as root")
	}
	// A host with many instances: every tree mount of the others on the
	// host, at every start. Then a busy node: the host's own mounts
	// outside any tree (pods' volumes, containers' root file systems,
	// other instances' network namespaces, overlays and sized areas).
	for _, c := range []struct{ dir, where string }{
		{filepath.Join(m.rt.trees, "crowd"), "other tree mounts on the host"},
		{filepath.Join(t.TempDir(), "crowd"), "other mounts on the host, outside the trees"},
	} {
		removeCrowd := crowd(t, c.dir, crowdMounts)
		crowded := []mode{
			{name: fmt.Sprintf("policy + bwrap backend (`Runtime.Exec`), %d %s", crowdMounts, c.where), run: m.ours},
			{name: fmt.Sprintf("bwrap invoked directly, same flags, %d %s", crowdMounts, c.where), run: m.rawBwrap},
			{name: fmt.Sprintf("`sandboxctl run -- true` (one-shot), %d %s", crowdMounts, c.where), run: m.sandboxctlRun},
		}
		interleave(crowded)
		removeCrowd()
		modes = append(modes, crowded...)
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
	oneShot, minimal := med(modes[3].d), med(modes[4].d)
	fmt.Fprintf(&b, "\nA one-shot `sandboxctl run -- true` takes %.1f× a minimal bwrap back to back (%s against %s; the goal is 2×), "+
		"%.1f× when each run comes alone (%s against %s). "+
		"Of it, bubblewrap with the policy's flags takes %s (%.1f× the minimal one: its namespaces, binds and seccomp filter); "+
		"sandboxctl's own %s are the process's start (Go's runtime and package initialisation), reading the configuration "+
		"and the instance's record, verifying the agent's mount tree and cgroup kept from the run before, and starting bubblewrap "+
		"inside that cgroup.\n", float64(oneShot)/float64(minimal), ms(oneShot), ms(minimal),
		float64(med(modes[5].d))/float64(med(modes[6].d)), ms(med(modes[5].d)), ms(med(modes[6].d)),
		ms(med(raw)), float64(med(raw))/float64(minimal), ms(oneShot-med(raw)))
	fmt.Fprintf(&b, "\nWith %d more mounts in other instances' trees on the host (as some %d instances' trees make), a command through the driver "+
		"takes %s and bubblewrap started in the host's namespace %s: bubblewrap copies the mount namespace it starts in and reads its "+
		"whole mount table for every read-only bind, so the driver starts it in a namespace holding its own instance's tree alone.\n",
		crowdMounts, crowdMounts/6, ms(med(modes[7].d)), ms(med(modes[8].d)))
	fmt.Fprintf(&b, "\nWith %d more mounts of the host outside the trees (a busy node's pods and containers, other instances' network "+
		"namespaces, overlays and sized areas), a command through the driver takes %s and bubblewrap started in the host's namespace %s: "+
		"of the host's mounts, a command's start namespace holds only those its bubblewrap binds and runs from, /proc, /dev, /sys, /usr and /etc.\n",
		crowdMounts, ms(med(modes[10].d)), ms(med(modes[11].d)))
	fmt.Fprintf(&b, "\n%d runs of each of the first five, interleaved, after 10 warm-up runs; %d of each of the next two, 50 ms apart; "+
		"%d of each of the last six, three at a time, interleaved. %s\n",
		benchRuns, spacedRuns, crowdedRuns, testenv.MachineNote())
	if out == "" {
		t.Logf("%s is not set, so the table is not written:\n%s", testenv.BenchOutEnv, b.String())
		return
	}
	if err := testenv.WriteBenchTable(out, "bench-bwrap", b.String()); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, b.String())
}

// crowdMounts is how many other tree mounts the crowded rows run among,
// and crowdedRuns how many times each of them is measured.
const (
	crowdMounts = 2000
	crowdedRuns = 40
)

// crowd mounts n binds in dir (made here), as other instances' trees
// or a busy node's mounts would be, and returns the function that removes
// them.
func crowd(tb testing.TB, dir string, n int) func() {
	tb.Helper()
	src := tb.TempDir()
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	var mounted []string
	remove := func() {
		for _, p := range mounted {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
				tb.Errorf("unmounting %s: %v", p, err)
			}
		}
		mounted = nil
		if err := os.RemoveAll(dir); err != nil {
			tb.Error(err)
		}
	}
	tb.Cleanup(remove)
	for i := range n {
		p := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(p, 0o700); err != nil {
			tb.Fatal(err)
		}
		if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
			tb.Fatalf("mounting %s: %v", p, err)
		}
		mounted = append(mounted, p)
	}
	return remove
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// BenchmarkStartStopped measures what the controller's pass does for a
// stopped Sandbox that gets a claim, and for one that has none left:
// Ensure lays out the areas, builds the mount tree, makes the cgroups and
// records the instance as running; Stop takes the tree and the cgroups
// down again. The CPU time of the process is reported beside the wall
// time: at a thousand Sandboxes the controller's CPU is mostly such
// system calls (docs/benchmarks-scale.md).
func BenchmarkStartStopped(b *testing.B) {
	testenv.Binary(b, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	if os.Geteuid() != 0 {
		testenv.Missing(b, "root", "mount trees and cgroups are made only as root; CI runs as root")
	}
	dir := b.TempDir()
	state := filepath.Join(dir, "state")
	rt, err := New(Config{StateDir: state})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := DetachTrees(state); err != nil {
			b.Error(err)
		}
	})
	spec := &v1alpha1.SandboxSpec{Agent: "bench", Binaries: []v1alpha1.BinaryName{"true"}}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	for b.Loop() {
		if _, err := rt.Ensure(ctx, in); err != nil {
			b.Fatal(err)
		}
		if err := rt.Stop(ctx, in.Name); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpu()-start)/float64(b.N)/1e3, "cpu-µs/op")
}
