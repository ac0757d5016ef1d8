package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"

	"github.com/cireilclaw/sandbox-controller/internal/sizedfs"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// A container with a rootfs size limit keeps its writable layer on a file
// system of that size (internal/sizedfs) in <agentDir>/.rootfs, instead of
// in the snapshot's own upper directory on the host's disk: its task gets
// the snapshot's lower layers with that upper layer, so a write beyond the
// limit fails inside the container (ENOSPC). The layer lives as long as
// the container (and its snapshot): Delete and a re-creation remove it.

// rootfsDisk is the sized file system of in's writable layer.
func rootfsDisk(in runtimes.Instance) sizedfs.FS {
	return sizedfs.FS{Dir: filepath.Join(in.AgentDir, ".rootfs"), Size: rootfsLimit(in), Anchor: filepath.Dir(in.AgentDir)}
}

// rootfsOpts are the task options giving a container with a rootfs size
// limit its sized writable layer; none without a limit. The first time,
// what the snapshot's upper directory holds moves onto it.
func (r *Runtime) rootfsOpts(ctx context.Context, c *containerd.Client, cont containerd.Container, in runtimes.Instance) ([]containerd.NewTaskOpts, error) {
	if rootfsLimit(in) <= 0 {
		return nil, nil
	}
	if in.AgentDir == "" {
		return nil, errors.New("a rootfs size limit needs the agent's directory, and the instance has none")
	}
	info, err := cont.Info(ctx)
	if err != nil {
		return nil, err
	}
	mounts, err := c.SnapshotService(info.Snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return nil, fmt.Errorf("reading the mounts of snapshot %s: %w", info.SnapshotKey, err)
	}
	if len(mounts) != 1 || mounts[0].Type != "overlay" {
		return nil, runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "starting container", in.Name,
			"rootfsSizeLimit needs the overlayfs snapshotter and an image of one layer or more; snapshotter %s gives %d %s mount(s)", info.Snapshotter, len(mounts), mountType(mounts))
	}
	disk := rootfsDisk(in)
	created, err := disk.Mount()
	if errors.Is(err, sizedfs.ErrUnsupported) {
		return nil, runtimes.Errorf(runtimes.ReasonLimitsUnavailable, "starting container", in.Name, "rootfsSizeLimit cannot be enforced: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("giving the writable layer its rootfsSizeLimit: %w", err)
	}
	upper, work := filepath.Join(disk.Dir, "upper"), filepath.Join(disk.Dir, "work")
	m := mounts[0]
	var options []string
	var oldUpper string
	for _, o := range m.Options {
		switch {
		case strings.HasPrefix(o, "upperdir="):
			oldUpper = strings.TrimPrefix(o, "upperdir=")
			o = "upperdir=" + upper
		case strings.HasPrefix(o, "workdir="):
			o = "workdir=" + work
		}
		options = append(options, o)
	}
	if oldUpper == "" {
		return nil, fmt.Errorf("the mount of snapshot %s names no upper directory", info.SnapshotKey)
	}
	if created {
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, err
			}
		}
		if err := sizedfs.CopyInto(oldUpper, upper); err != nil {
			// The snapshot's layer is untouched; a half-filled new one
			// would hide it for good, so it goes and the next start retries.
			return nil, errors.Join(fmt.Errorf("the writable layer could not move onto its rootfsSizeLimit of %d bytes (does it fit?): %w", rootfsLimit(in), err), disk.Remove())
		}
	}
	m.Options = options
	return []containerd.NewTaskOpts{containerd.WithRootFS([]mount.Mount{m})}, nil
}

func mountType(ms []mount.Mount) string {
	if len(ms) == 0 {
		return "no"
	}
	return ms[0].Type
}

// removeRootfs removes the sized writable layer of a container being
// deleted, when it had one.
func removeRootfs(in runtimes.Instance) error {
	if in.AgentDir == "" || rootfsLimit(in) <= 0 {
		return nil
	}
	return rootfsDisk(in).Remove()
}
