package incus

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// Usage reads what a running instance's processes use, from the cgroup
// LXC made for it (lxc.payload.<name>), which holds its limits: the init
// the daemon reports may sit in a child cgroup the guest made.
func (r *Runtime) Usage(name string) (runtimes.Usage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, inst, _, err := r.locate(ctx, name)
	if err != nil {
		return runtimes.Usage{}, err
	}
	if inst == nil {
		return runtimes.Usage{}, fmt.Errorf("instance %s does not exist", name)
	}
	st, err := cl.GetInstanceState(ctx, name)
	if err != nil {
		return runtimes.Usage{}, err
	}
	if st.Pid <= 0 {
		return runtimes.Usage{}, fmt.Errorf("instance %s is not running", name)
	}
	u, err := cgroup.ProcessUsage("/proc", int(st.Pid), payloadCgroup, payloadPrefix+lxcName(inst.Project, name))
	if err != nil {
		return runtimes.Usage{}, fmt.Errorf("reading the cgroup of instance %s: %w", name, err)
	}
	return runtimes.Usage{MemoryBytes: u.MemoryBytes, Pids: u.Pids, CPUSeconds: u.CPUSeconds, OOMKills: u.OOMKills, PidsLimited: u.PidsMax}, nil
}

// payloadPrefix begins the name of an instance's cgroup: lxc.payload.<name>.
const payloadPrefix = "lxc.payload."

// lxcName is the name LXC gives instance name of project: the name in the
// default project, else the project's name, '_', and the name.
func lxcName(project, name string) string {
	if project != "" && project != "default" {
		return project + "_" + name
	}
	return name
}

// payloadCgroup cuts a cgroup path after its lxc.payload.<name> component.
func payloadCgroup(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, payloadPrefix) {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return path
}
