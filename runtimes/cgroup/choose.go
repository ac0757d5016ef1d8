//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Which of the two cgroup v1 starts that keep the controller outside an
// instance's cgroups is faster depends on the host. Moving a stopped
// command in by its pid takes the kernel's global cgroup lock, and on
// some kernels an RCU grace period with it: 5 to 15 ms a start on some
// hosts, 0.2 ms on others. The starter costs the exec of a static binary
// and its runtime's start: about 0.5 ms on some hosts, 6 to 7 ms on
// others, where every page fault is slow. MeasureStarts measures both
// where the controller runs, each as a start makes it.

// StartCosts are what the two starts cost on this host. Both count one
// fork and exec of the starter binary, which the starts they stand for
// make of the command: they differ by what each adds.
type StartCosts struct {
	// Moved is one start stopped at its first instruction, moved into
	// each hierarchy's cgroup by its pid (the cgroups it is already in:
	// the kernel takes its locks and moves nothing) and let go, as
	// startV1 does.
	Moved time.Duration
	// Starter is one start of the starter up to its exit: its runtime's
	// start.
	Starter time.Duration
}

// PreferMove says whether moving stopped commands in is the faster start.
func (c StartCosts) PreferMove() bool {
	return c.Moved < c.Starter
}

func (c StartCosts) String() string {
	return fmt.Sprintf("a start moved in takes %v, through the starter %v", c.Moved.Round(10*time.Microsecond), c.Starter.Round(10*time.Microsecond))
}

// MeasureStarts measures each start probes times, running the starter
// with no command to start (it exits at once, having said how it is
// used), and keeps the medians; once a process, by starter. The moved
// starts come spacing apart, so that each takes the kernel's locks
// alone, as a command's start does on a controller that is not starting
// others. A probe still running after probeTimeout is killed, and the
// measure fails.
func MeasureStarts(starter string, probes int, spacing time.Duration) (StartCosts, error) {
	measured.mu.Lock()
	defer measured.mu.Unlock()
	if c, ok := measured.costs[starter]; ok {
		return c, nil
	}
	c, err := measureStarts(starter, probes, spacing)
	if err == nil {
		measured.costs[starter] = c
	}
	return c, err
}

// probeTimeout bounds one probe: the starter, given no command, exits
// as soon as its runtime has started.
var probeTimeout = 5 * time.Second

// measured keeps what MeasureStarts found, by starter: what a start costs
// on a host does not change in a process's life, and each driver a
// process makes (a test makes many) would measure again.
var measured = struct {
	mu    sync.Mutex
	costs map[string]StartCosts
}{costs: map[string]StartCosts{}}

func measureStarts(starter string, probes int, spacing time.Duration) (StartCosts, error) {
	if probes < 1 {
		return StartCosts{}, fmt.Errorf("measuring the cgroup v1 starts: %d probes", probes)
	}
	var moved, starts []time.Duration
	for range probes {
		d, err := measureStarter(starter)
		if err != nil {
			return StartCosts{}, err
		}
		starts = append(starts, d)
	}
	for range probes {
		time.Sleep(spacing)
		d, err := measureMoved(starter)
		if err != nil {
			return StartCosts{}, err
		}
		moved = append(moved, d)
	}
	return StartCosts{Moved: median(moved), Starter: median(starts)}, nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// probe is the starter run with no command to start, killed at its
// deadline; cancel releases it, and failed says why a run of it failed.
func probe(starter string) (cmd *exec.Cmd, failed func(error) error, cancel func()) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	failed = func(err error) error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%s was killed after %v: it had not exited (%w)", starter, probeTimeout, err)
		}
		return err
	}
	return exec.CommandContext(ctx, starter, StarterVerb), failed, cancel
}

// measureStarter times one run of the starter to its exit.
func measureStarter(starter string) (time.Duration, error) {
	cmd, failed, cancel := probe(starter)
	defer cancel()
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.Exited():
	case err != nil:
		return 0, fmt.Errorf("measuring the starter %s: %w", starter, failed(err))
	}
	return d, nil
}

// measureMoved times one start of the probe stopped at its first
// instruction, moved by its pid into the v1 cgroups of the thread that
// forked it (where it already is) and let go, as startV1 starts a
// command.
func measureMoved(starter string) (time.Duration, error) {
	// The child is forked from this thread, into its cgroups.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := threadCgroups()
	if err != nil {
		return 0, fmt.Errorf("measuring a start moved in: %w", err)
	}
	cmd, failed, cancel := probe(starter)
	defer cancel()
	start := time.Now()
	err = startStopped(cmd, func(c string) string { return filepath.Join(Mount, c, own[c]) }, "this process")
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("measuring a start moved in: %w", err)
	}
	var exit *exec.ExitError
	if err := cmd.Wait(); err != nil && (!errors.As(err, &exit) || !exit.Exited()) {
		return 0, fmt.Errorf("measuring a start moved in: %w", failed(err))
	}
	return d, nil
}
