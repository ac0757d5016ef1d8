package containerd

import (
	"context"
	"flag"
	"os"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Flags binds the daemon's address, namespace, FIFO directory and mount
// namespace on fs, each defaulting to the environment containerd's own
// tools read.
func Flags(fs *flag.FlagSet) runtimes.Constructor {
	var cfg Config
	fs.StringVar(&cfg.Address, "containerd-address", envOr("CONTAINERD_ADDRESS", "/run/containerd/containerd.sock"), "containerd socket for the containerd backend (default $CONTAINERD_ADDRESS, else /run/containerd/containerd.sock)")
	fs.StringVar(&cfg.Namespace, "containerd-namespace", envOr("CONTAINERD_NAMESPACE", DefaultNamespace), "containerd namespace of the containers and their images")
	fs.StringVar(&cfg.FIFODir, "containerd-fifo-dir", os.Getenv("CONTAINERD_FIFO_DIR"), "directory for the exec FIFOs shared with containerd's shims (default: containerd's)")
	fs.StringVar(&cfg.MountNamespace, "containerd-mount-namespace", os.Getenv("CONTAINERD_MOUNT_NAMESPACE"), "mount namespace of containerd and its runc, where the containerd backend builds its containers' mount trees: "+DaemonMountNamespace+" (that of the process answering --containerd-address, found each time; a controller in a pod needs hostPID), or a namespace file such as /proc/PID/ns/mnt (default $CONTAINERD_MOUNT_NAMESPACE; empty: the controller's own, for a controller on the node)")
	return func(ctx context.Context, _ string) (runtimes.Runtime, func(), error) {
		rt, err := New(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return rt, func() { _ = rt.Close() }, nil
	}
}

// envOr is the environment variable key, else def.
func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
