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
