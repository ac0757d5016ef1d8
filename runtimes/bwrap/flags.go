package bwrap

import (
	"context"
	"flag"
	"path/filepath"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Flags binds the driver's cgroup flags on fs; the driver keeps its state
// in <state-dir>/bwrap.
func Flags(fs *flag.FlagSet) runtimes.Constructor {
	var cfg Config
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "cgroup (a path from the root of each hierarchy) below which the bwrap backend makes each instance's cgroup with its resource limits; empty: below the controller's own cgroup (in a pod, the pod's)")
	fs.StringVar(&cfg.ContainerBundles, "container-bundles", "", "on a cluster node: the node runtime's directory of its containers' bundles, each with the container's root file system at <id>/rootfs (containerd: <state>/io.containerd.runtime.v2.task/k8s.io, /run/containerd/io.containerd.runtime.v2.task/k8s.io by default), as this process sees it (config/manager mounts it with HostToContainer propagation); a bwrap Sandbox with spec.bwrap.image sees the root file system of its Pod's container as its system directories; empty: such Sandboxes are refused")
	fs.StringVar(&cfg.Starter, "bwrap-starter", "", "the cgroup v1 starter, cmd/sandbox-holder, that bwrap commands start through (it moves itself into the instance's cgroups and becomes the command: faster a start than moving the command in on hosts where a move waits for the kernel, 5 to 15 ms); it runs as root, so only root may be able to change it; empty: sandbox-holder beside this binary when it is there (the image and make build put it there), else commands are moved in")
	fs.StringVar(&cfg.CgroupV1Start, "bwrap-cgroup-v1-start", StartAuto, "how bwrap commands start inside their instance's cgroups on cgroup v1: auto measures at start which is faster on this host, the starter or moving the stopped command in, and takes it; starter always takes the starter (when there is one); move always moves commands in")
	fs.BoolVar(&cfg.AllowUnlimited, "allow-unlimited-sandboxes", false, "let bwrap Sandboxes run WITHOUT resource limits where no cgroup can be made, with a warning; without it such a Sandbox is Ready=False (LimitsUnavailable)")
	return func(_ context.Context, stateDir string) (runtimes.Runtime, func(), error) {
		c := cfg
		c.StateDir = filepath.Join(stateDir, "bwrap")
		rt, err := New(c)
		if err != nil {
			return nil, nil, err
		}
		return rt, nil, nil
	}
}
