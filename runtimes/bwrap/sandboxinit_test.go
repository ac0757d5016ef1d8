package bwrap_test

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// A command cancelled at any moment of its start leaves nothing running:
// not bubblewrap's init, whose parent-death signal is set only after its
// clone (an init whose bubblewrap was killed before then ran on with the
// command, past the cancel and any exec timeout), nor the command.
func TestCancelAtAnyMomentOfTheStartLeavesNothing(t *testing.T) {
	s := newSandbox(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"sleep"}}, nil, bwrap.Host{})
	marker := strconv.Itoa(5000 + os.Getpid()%1000)
	for range 300 {
		ctx, cancel := context.WithCancel(context.Background())
		// bubblewrap takes about 6 ms to start the command here: the
		// cancels fall before, during and after its clone.
		after := time.Duration(rand.IntN(15000)) * time.Microsecond
		go func() { time.Sleep(after); cancel() }()
		_, _ = s.rt.Exec(ctx, s.in.Name, runtimes.ExecRequest{Argv: []string{"sleep", marker}})
		cancel()
	}
	deadline := time.Now().Add(10 * time.Second)
	for left := sleeping(marker); len(left) > 0; left = sleeping(marker) {
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the last cancel, %d processes of the cancelled commands still run:\n%s", len(left), strings.Join(left, "\n"))
		}
		time.Sleep(testenv.PollInterval)
	}
}

// sleeping lists the processes whose arguments end in `sleep marker`.
func sleeping(marker string) []string {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasSuffix(string(b), "sleep\x00"+marker+"\x00") {
			out = append(out, filepath.Base(filepath.Dir(p))+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// A start that fails (here the starter cannot exec bubblewrap) is not
// held by a cancel that lands meanwhile: the kill waits for bubblewrap to
// name its init only while the process that would name it lives.
func TestACancelDoesNotHoldAFailedStart(t *testing.T) {
	real := testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := testenv.SharedDir(t)
	// A bubblewrap only root may run: the starter, as the agent, cannot.
	private := filepath.Join(dir, "bwrap-root-only")
	b, err := os.ReadFile(real)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(private, b, 0o700); err != nil {
		t.Fatal(err)
	}
	rt, err := bwrap.New(bwrap.Config{
		StateDir: filepath.Join(dir, "state"),
		Bwrap:    private,
		Starter:  testenv.Starter(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bwrap.DetachTrees(filepath.Join(dir, "state")); err != nil {
			t.Error(err)
		}
	})
	in, err := instance.Standalone(&v1alpha1.SandboxSpec{Agent: "bea", Binaries: []v1alpha1.BinaryName{"sleep"}}, instance.Host{AreasRoot: filepath.Join(dir, "areas"), Home: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	var slowest time.Duration
	for range 60 {
		ctx, cancel := context.WithCancel(context.Background())
		after := time.Duration(rand.IntN(3000)) * time.Microsecond
		go func() { time.Sleep(after); cancel() }()
		t0 := time.Now()
		if _, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sleep", "1"}}); err == nil {
			t.Fatal("a command ran without its bubblewrap")
		}
		slowest = max(slowest, time.Since(t0))
		cancel()
	}
	if slowest > 3*time.Second {
		t.Errorf("the slowest failed start took %v: a cancel held it", slowest)
	}
}
