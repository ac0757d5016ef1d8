package containerd

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// Usage reads what a running container's processes use, from the cgroup
// its init is in (every process of the container shares it: exec'd
// processes join the task's cgroup).
func (r *Runtime) Usage(name string) (runtimes.Usage, error) {
	const op = "reading usage"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx, c, err := r.connect(ctx, op, name)
	if err != nil {
		return runtimes.Usage{}, err
	}
	cont, err := c.LoadContainer(ctx, name)
	if err != nil {
		return runtimes.Usage{}, r.fail(op, name, err)
	}
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return runtimes.Usage{}, fmt.Errorf("container %s has no task", name)
	}
	if err != nil {
		return runtimes.Usage{}, r.fail(op, name, err)
	}
	// Its cgroup is named after it, below its Pod's on a cluster.
	u, err := cgroup.ProcessUsage(r.cfg.ProcDir, int(task.Pid()), nil, name, podCgroupName(name))
	if err != nil {
		return runtimes.Usage{}, fmt.Errorf("reading the cgroup of container %s: %w", name, err)
	}
	return runtimes.Usage{MemoryBytes: u.MemoryBytes, Pids: u.Pids, CPUSeconds: u.CPUSeconds, OOMKills: u.OOMKills, PidsLimited: u.PidsMax}, nil
}
