//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The faster start is chosen.
func TestTheFasterStartIsPreferred(t *testing.T) {
	for _, c := range []struct {
		costs StartCosts
		move  bool
	}{
		{StartCosts{Moved: 1200 * time.Microsecond, Starter: 7 * time.Millisecond}, true},
		{StartCosts{Moved: 10 * time.Millisecond, Starter: 1500 * time.Microsecond}, false},
	} {
		if got := c.costs.PreferMove(); got != c.move {
			t.Errorf("%v: prefer a move %v, want %v", c.costs, got, c.move)
		}
	}
}

// Both starts are measured on this host, each a process's start.
func TestMeasureStartsMeasuresBoth(t *testing.T) {
	m := newManager(t)
	costs, err := MeasureStarts(testenv.Starter(t), 3, time.Millisecond)
	if m.V2 {
		// Commands are cloned into their cgroup: nothing to choose.
		if err == nil {
			t.Fatalf("on cgroup v2 a v1 move was measured: %v", costs)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if costs.Moved <= 0 || costs.Starter <= 0 {
		t.Fatalf("measured %+v: both must be measured", costs)
	}
	// Both are a process's start at least: a fork and an exec.
	if min(costs.Moved, costs.Starter) < 100*time.Microsecond {
		t.Errorf("measured %v: too fast for a process's start", costs)
	}
	t.Logf("on this host %v", costs)
}

// A starter that cannot be run is the measure's error, naming it.
func TestMeasureStartsNamesAStarterItCannotRun(t *testing.T) {
	newManager(t)
	missing := filepath.Join(t.TempDir(), StarterName)
	_, err := MeasureStarts(missing, 1, 0)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("measuring with a starter that is not there: %v; want an error naming it", err)
	}
}

// A starter that does not exit is killed at the probe's deadline, and the
// measure fails saying so, instead of holding the driver's start.
func TestAProbeThatHangsIsKilledAtItsDeadline(t *testing.T) {
	newManager(t)
	hang := filepath.Join(t.TempDir(), StarterName)
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { probeTimeout = d }(probeTimeout)
	probeTimeout = 200 * time.Millisecond
	start := time.Now()
	_, err := measureStarts(hang, 1, 0)
	if err == nil || !strings.Contains(err.Error(), "killed after 200ms") {
		t.Fatalf("measuring with a starter that hangs: %v; want the probe killed at its deadline", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the measure took %v with a probe deadline of %v", took, probeTimeout)
	}
}
