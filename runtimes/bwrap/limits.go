package bwrap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/internal/startns"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// An instance's commands share one cgroup (runtimes/cgroup) with the
// instance's limits: a fork bomb stops at the pids limit, a memory hog is
// killed at the memory limit, CPU is throttled, and no agent can take the
// node's process table or memory from the controller and the others.

// cgroupsOf is the manager of the instance's cgroup: below its Pod's
// cgroup when it has a Pod (on a cluster, so that the kubelet accounts for
// its commands), else below the driver's own parent. Nil with no error:
// the driver runs without cgroups.
func (r *Runtime) cgroupsOf(in runtimes.Instance) (*cgroup.Manager, error) {
	if in.Pod == nil {
		if r.cgroups == nil {
			return nil, r.cgroupErr
		}
		return r.cgroups, nil
	}
	key := in.Pod.CgroupRoot + "\x00" + in.Pod.Cgroup
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.podCgroups[key]; m != nil {
		return m, nil
	}
	m, err := cgroup.At(in.Pod.CgroupRoot, in.Pod.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("the cgroup of Pod %s: %w", in.Pod.UID, err)
	}
	m.JoinToStart, m.Starter = r.joinToStart, r.starter
	if r.podCgroups == nil {
		r.podCgroups = map[string]*cgroup.Manager{}
	}
	r.podCgroups[key] = m
	return m, nil
}

// ensureCgroup makes the instance's cgroup and sets its limits, or
// refuses the instance when no cgroup can be made (unless the driver was
// told to allow running unlimited; never for an instance with a Pod,
// whose cgroup the kubelet made).
func (r *Runtime) ensureCgroup(in runtimes.Instance) error {
	m, err := r.cgroupsOf(in)
	if m == nil {
		if r.allowUnlimited && in.Pod == nil {
			fmt.Fprintf(r.warnings, "WARNING: instance %s runs WITHOUT resource limits (allowed by configuration): %v\n", in.Name, err)
			return nil
		}
		return runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "ensuring", in.Name,
			"the instance's limits cannot be enforced: %v; run the controller where it can make cgroups (root, or a delegated cgroup v2 subtree), or allow unlimited sandboxes explicitly", err)
	}
	res := in.Resources
	if err := m.Ensure(in.Name, cgroup.Limits{CPUMillis: res.CPUMillis, MemoryBytes: res.MemoryBytes, Pids: res.Pids, CPURequestMillis: res.CPURequestMillis}); err != nil {
		return runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "ensuring", in.Name, "%w", err)
	}
	return nil
}

// hasCgroup says whether the instance's cgroup is there (or the driver
// runs without cgroups).
func (r *Runtime) hasCgroup(in runtimes.Instance) bool {
	m, err := r.cgroupsOf(in)
	if m == nil {
		return err == nil || (r.allowUnlimited && in.Pod == nil)
	}
	return m.Exists(in.Name)
}

// run starts cmd inside the instance's cgroup and, when it has one, its
// network namespace, and waits for it; started is called once, with the
// start's error, as soon as the start is over. A command whose mounts
// (the instance's tree areas and image mount) are known starts in a start
// namespace holding them and, of the host's mounts, those its bubblewrap
// binds and runs from (internal/startns), where one can be made.
func (r *Runtime) run(in runtimes.Instance, mounts []string, cmd *exec.Cmd, started func(error)) error {
	called := false
	startAndWait := func(start func() error) error {
		called = true
		err := start()
		started(err)
		if err != nil {
			return err
		}
		return cmd.Wait()
	}
	if r.starts != nil && len(mounts) > 0 {
		var pre func() error
		if in.Network != nil {
			ns := egress.Namespace{Path: in.Network.Namespace}
			pre = ns.Enter
		}
		// Of the host's mounts, what bubblewrap binds and runs from, and
		// the hierarchies of the cgroups the start opens by path (a
		// Pod's are where its node's are mounted for the controller).
		host := startns.ForBubblewrap(cmd.Args[1:], cmd.ExtraFiles, cmd.Path, r.starter)
		if m, _ := r.cgroupsOf(in); host != nil && m != nil {
			host.Paths = append(host.Paths, m.Dirs(in.Name)...)
		}
		err := r.starts.RunWith(mounts, host, pre, func() error {
			return startAndWait(func() error { return r.startInCgroup(in, cmd) })
		})
		switch {
		case called:
			return err
		case !errors.Is(err, startns.ErrUnavailable):
			// The network namespace could not be entered: nothing
			// started.
			started(err)
			return err
		}
		r.noStartNamespace.Do(func() {
			fmt.Fprintf(r.warnings, "sandbox: a command started in the host's mount namespace, where a start copies every instance's mount tree (said once; later commands try again): %v\n", err)
		})
	}
	return startAndWait(func() error { return r.startIn(in, cmd) })
}

// startIn starts cmd inside the instance's cgroup and, when it has one,
// its network namespace.
func (r *Runtime) startIn(in runtimes.Instance, cmd *exec.Cmd) error {
	if in.Network != nil {
		// On a goroutine of its own, as a joining start needs.
		ns := egress.Namespace{Path: in.Network.Namespace}
		return ns.Do(func() error { return r.startInCgroup(in, cmd) })
	}
	if r.joinToStart {
		return cgroup.StartOnOwnThread(func() error { return r.startInCgroup(in, cmd) })
	}
	return r.startInCgroup(in, cmd)
}

// startInCgroup starts cmd inside the instance's cgroup, or plainly when
// the driver runs without cgroups.
func (r *Runtime) startInCgroup(in runtimes.Instance, cmd *exec.Cmd) error {
	m, err := r.cgroupsOf(in)
	if m == nil {
		if in.Pod != nil || !r.allowUnlimited {
			return runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "running in", in.Name, "%v", err)
		}
		return cmd.Start()
	}
	return m.Start(in.Name, cmd)
}

// removeCgroup kills what is left in the instance's cgroup and removes it
// (and forgets the Pod's cgroup, which the instance was the one user of).
func (r *Runtime) removeCgroup(in runtimes.Instance) {
	if m, _ := r.cgroupsOf(in); m != nil {
		_ = m.Remove(in.Name)
	}
	if in.Pod != nil {
		r.mu.Lock()
		delete(r.podCgroups, in.Pod.CgroupRoot+"\x00"+in.Pod.Cgroup)
		r.mu.Unlock()
	}
}

// Usage reads what the instance's commands use now (runtimes.UsageReader).
func (r *Runtime) Usage(name string) (runtimes.Usage, error) {
	in := runtimes.Instance{Name: name}
	r.mu.Lock()
	inPods := len(r.podCgroups) > 0
	r.mu.Unlock()
	if inPods {
		// Which Pod's cgroup it is in is the record's: read only where
		// instances run in Pods (a cluster's node, where Ensure has met
		// them), never on every reconcile of a machine without Pods.
		if rec, err := r.load(name); err == nil && rec != nil {
			in = rec.Instance
		}
	}
	m, err := r.cgroupsOf(in)
	if m == nil {
		return runtimes.Usage{}, fmt.Errorf("instance %s has no cgroup: %w", name, errors.Join(err, cgroup.ErrUnavailable))
	}
	u, err := m.Usage(name)
	if err != nil {
		return runtimes.Usage{}, err
	}
	return runtimes.Usage{MemoryBytes: u.MemoryBytes, Pids: u.Pids, CPUSeconds: u.CPUSeconds, OOMKills: u.OOMKills, PidsLimited: u.PidsMax}, nil
}

// findStarter is the cgroup v1 starter commands start through: the one
// configured, which must be fit to run as root, else the sandbox-holder
// beside this executable when it is (one that is not is left out, with a
// warning), else none.
func findStarter(configured string, warnings io.Writer) (string, error) {
	if configured != "" {
		fi, err := os.Lstat(configured)
		if err != nil {
			return "", fmt.Errorf("the bwrap starter: %w", err)
		}
		if err := cgroup.CheckStarter(configured, fi); err != nil {
			return "", err
		}
		return configured, nil
	}
	p, err := starterBeside()
	if err != nil {
		fmt.Fprintf(warnings, "sandbox: not using the cgroup starter beside this binary (commands start 5 to 15 ms slower on cgroup v1): %v\n", err)
	}
	return p, nil
}

// startProbes and startProbeSpacing are how chooseStart measures.
const (
	startProbes       = 3
	startProbeSpacing = 20 * time.Millisecond
)

// chooseStart is the starter commands start through on this cgroup v1
// host, or "" to move them in, whichever cgroup.MeasureStarts finds
// faster, and the costs measured; the starter, with a warning, when the
// measure fails.
func chooseStart(starter string, warnings io.Writer) (string, cgroup.StartCosts) {
	costs, err := cgroup.MeasureStarts(starter, startProbes, startProbeSpacing)
	switch {
	case err != nil:
		fmt.Fprintf(warnings, "sandbox: commands start through the cgroup starter %s; which start is faster here could not be measured: %v\n", starter, err)
		return starter, costs
	case costs.PreferMove():
		return "", costs
	}
	return starter, costs
}

// CgroupV1Start says how commands start inside their instance's cgroups
// on cgroup v1 ("starter", "move" or "join"; "" on cgroup v2 or without
// cgroups) and, when New measured the two starts to choose, what each
// cost.
func (r *Runtime) CgroupV1Start() (string, *cgroup.StartCosts) {
	switch {
	case r.cgroups == nil || r.cgroups.V2:
		return "", r.startCosts
	case r.joinToStart:
		return "join", r.startCosts
	case r.starter != "":
		return StartStarter, r.startCosts
	}
	return StartMove, r.startCosts
}

// starterBeside is cgroup.StarterBeside for this executable.
func starterBeside() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return cgroup.StarterBeside(exe)
}
