package bwrap

import (
	"errors"
	"fmt"
	"os/exec"

	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// An instance's commands share one cgroup (runtimes/cgroup) with the
// instance's limits: a fork bomb stops at the pids limit, a memory hog is
// killed at the memory limit, CPU is throttled, and no agent can take the
// node's process table or memory from the controller and the others.

// ensureCgroup makes the instance's cgroup and sets its limits, or
// refuses the instance when no cgroup can be made (unless the driver was
// told to allow running unlimited).
func (r *Runtime) ensureCgroup(in runtimes.Instance) error {
	if r.cgroups == nil {
		if r.allowUnlimited {
			fmt.Fprintf(r.warnings, "WARNING: instance %s runs WITHOUT resource limits (allowed by configuration): %v\n", in.Name, r.cgroupErr)
			return nil
		}
		return runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "ensuring", in.Name,
			"the instance's limits cannot be enforced: %v; run the controller where it can make cgroups (root, or a delegated cgroup v2 subtree), or allow unlimited sandboxes explicitly", r.cgroupErr)
	}
	res := in.Resources
	if err := r.cgroups.Ensure(in.Name, cgroup.Limits{CPUMillis: res.CPUMillis, MemoryBytes: res.MemoryBytes, Pids: res.Pids, CPURequestMillis: res.CPURequestMillis}); err != nil {
		return runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "ensuring", in.Name, "%w", err)
	}
	return nil
}

// startIn starts cmd inside the instance's cgroup and, when it has one,
// its network namespace.
func (r *Runtime) startIn(name string, network *runtimes.Network, cmd *exec.Cmd) error {
	if network == nil {
		return r.startInCgroup(name, cmd)
	}
	ns := egress.Namespace{Path: network.Namespace}
	return ns.Do(func() error { return r.startInCgroup(name, cmd) })
}

// startInCgroup starts cmd inside the instance's cgroup, or plainly when
// the driver runs without cgroups.
func (r *Runtime) startInCgroup(name string, cmd *exec.Cmd) error {
	if r.cgroups == nil {
		return cmd.Start()
	}
	return r.cgroups.Start(name, cmd)
}

// removeCgroup kills what is left in the instance's cgroup and removes it.
func (r *Runtime) removeCgroup(name string) {
	if r.cgroups != nil {
		_ = r.cgroups.Remove(name)
	}
}

// Usage reads what the instance's commands use now (runtimes.UsageReader).
func (r *Runtime) Usage(name string) (runtimes.Usage, error) {
	if r.cgroups == nil {
		return runtimes.Usage{}, fmt.Errorf("instance %s has no cgroup: %w", name, errors.Join(r.cgroupErr, cgroup.ErrUnavailable))
	}
	u, err := r.cgroups.Usage(name)
	if err != nil {
		return runtimes.Usage{}, err
	}
	return runtimes.Usage{MemoryBytes: u.MemoryBytes, Pids: u.Pids, CPUSeconds: u.CPUSeconds, OOMKills: u.OOMKills, PidsLimited: u.PidsMax}, nil
}
