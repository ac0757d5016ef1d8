package containerd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cireilclaw/sandbox-controller/internal/mountinfo"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// overlay reports OverlayHealthy: the writable root (rootHealth), then the
// overlay mounts.
func (r *Runtime) overlay(ctx context.Context, c *containerd.Client, info containers.Container, task containerd.Task, running bool, in runtimes.Instance) (*runtimes.Health, error) {
	root, err := r.rootHealth(ctx, c, info, task, running, in)
	if err != nil {
		return nil, err
	}
	return runtimes.CombineHealth(root, runtimes.OverlayMountsHealth(in, running)), nil
}

// rootHealth reports the health of the container's writable root: its
// snapshot exists; while the task runs, the task's root is an overlay mount
// whose lower dirs all exist; and the snapshot's size is within the
// rootfs size limit when one is set.
func (r *Runtime) rootHealth(ctx context.Context, c *containerd.Client, info containers.Container, task containerd.Task, running bool, in runtimes.Instance) (*runtimes.Health, error) {
	sn := c.SnapshotService(info.Snapshotter)
	if _, err := sn.Stat(ctx, info.SnapshotKey); err != nil {
		if errdefs.IsNotFound(err) {
			return unhealthy(runtimes.ReasonSnapshotMissing, "snapshot %s of container %s is missing from snapshotter %s", info.SnapshotKey, info.ID, info.Snapshotter), nil
		}
		return nil, fmt.Errorf("looking up snapshot %s: %w", info.SnapshotKey, err)
	}
	mounted := "not mounted while the container is stopped"
	if running && task != nil && info.Snapshotter == DefaultSnapshotter {
		m, err := r.rootMount(task.Pid())
		if err != nil {
			return unhealthy(runtimes.ReasonNotMounted, "root of container %s: %v", info.ID, err), nil
		}
		if m.FSType != "overlay" {
			return unhealthy(runtimes.ReasonNotMounted, "root of container %s is a %s mount, not overlay", info.ID, m.FSType), nil
		}
		lower := m.LowerDirs()
		if len(lower) == 0 {
			return unhealthy(runtimes.ReasonNotMounted, "root overlay of container %s names no lower dir", info.ID), nil
		}
		for _, d := range lower {
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				return unhealthy(runtimes.ReasonNotMounted, "lower dir %s of the root overlay of container %s is missing", d, info.ID), nil //nolint:nilerr // a missing lower dir is a health finding, not an error
			}
		}
		mounted = fmt.Sprintf("mounted as overlay over %d lower dir(s)", len(lower))
	}
	limit := rootfsLimit(in)
	if limit <= 0 {
		return &runtimes.Health{Healthy: true, Reason: runtimes.ReasonHealthy,
			Message: fmt.Sprintf("snapshot %s present, %s; no rootfs size limit", info.SnapshotKey, mounted)}, nil
	}
	size, err := r.rootfsUsage(ctx, sn, info.SnapshotKey, in)
	if err != nil {
		return nil, err
	}
	used, max := bytes(size), bytes(limit)
	if size > limit {
		return unhealthy(runtimes.ReasonUpperDirOverLimit, "writable layer of container %s uses %s, over its rootfsSizeLimit of %s", info.ID, used, max), nil
	}
	return &runtimes.Health{Healthy: true, Reason: runtimes.ReasonHealthy,
		Message: fmt.Sprintf("snapshot %s present, %s; writable layer uses %s of %s", info.SnapshotKey, mounted, used, max)}, nil
}

// rootfsUsage is what the writable layer holds: its sized file system
// while that is mounted, else the snapshot.
func (r *Runtime) rootfsUsage(ctx context.Context, sn snapshots.Snapshotter, key string, in runtimes.Instance) (int64, error) {
	if in.AgentDir != "" {
		disk := rootfsDisk(in)
		if ok, err := disk.Mounted(); err == nil && ok {
			used, _, err := disk.Usage()
			return used, err
		}
	}
	u, err := sn.Usage(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("measuring snapshot %s: %w", key, err)
	}
	return u.Size, nil
}

func unhealthy(reason runtimes.Reason, format string, args ...any) *runtimes.Health {
	return &runtimes.Health{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

func bytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// rootMount reads the mount the task's init sees at /.
func (r *Runtime) rootMount(pid uint32) (MountInfo, error) {
	f, err := os.Open(filepath.Join(r.cfg.ProcDir, strconv.FormatUint(uint64(pid), 10), "mountinfo"))
	if err != nil {
		return MountInfo{}, fmt.Errorf("reading the mount table of its init: %w", err)
	}
	defer f.Close()
	m, ok, err := FindMount(f, "/")
	if err != nil {
		return MountInfo{}, err
	}
	if !ok {
		return MountInfo{}, fmt.Errorf("nothing is mounted at / in the mount table of pid %d", pid)
	}
	return m, nil
}

// MountInfo is one line of /proc/<pid>/mountinfo.
type MountInfo struct {
	MountPoint   string
	FSType       string
	Source       string
	SuperOptions []string
}

// LowerDirs are the lower directories of an overlay mount, from either the
// lowerdir= list or the one-per-option lowerdir+= form, top layer first.
func (m MountInfo) LowerDirs() []string {
	var out []string
	for _, o := range m.SuperOptions {
		if v, ok := strings.CutPrefix(o, "lowerdir+="); ok {
			out = append(out, v)
		} else if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			out = append(out, splitLowerDirs(v)...)
		}
	}
	return out
}

// splitLowerDirs splits a lowerdir= value on the colons overlayfs
// separates layers with; "\:" is a colon inside a path.
func splitLowerDirs(v string) []string {
	var out []string
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch {
		case v[i] == '\\' && i+1 < len(v):
			i++
			b.WriteByte(v[i])
		case v[i] == ':':
			out = append(out, b.String())
			b.Reset()
		default:
			b.WriteByte(v[i])
		}
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// FindMount returns the last mount at mountPoint in a mountinfo table: the
// one on top, which is what a path there resolves to.
func FindMount(r io.Reader, mountPoint string) (MountInfo, bool, error) {
	var found MountInfo
	ok := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		m, err := parseMountInfo(sc.Text())
		if err != nil {
			return MountInfo{}, false, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		if m.MountPoint == mountPoint {
			found, ok = m, true
		}
	}
	if err := sc.Err(); err != nil {
		return MountInfo{}, false, fmt.Errorf("reading mountinfo: %w", err)
	}
	return found, ok, nil
}

// parseMountInfo reads "id parent major:minor root mountpoint options
// [optional fields...] - fstype source superoptions" (proc(5)).
func parseMountInfo(line string) (MountInfo, error) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 6 || sep < 0 || sep+3 > len(fields) {
		return MountInfo{}, fmt.Errorf("malformed line %q", line)
	}
	m := MountInfo{
		MountPoint: mountinfo.Unescape(fields[4]),
		FSType:     fields[sep+1],
		Source:     mountinfo.Unescape(fields[sep+2]),
	}
	if sep+3 < len(fields) {
		for _, o := range strings.Split(fields[sep+3], ",") {
			m.SuperOptions = append(m.SuperOptions, mountinfo.Unescape(o))
		}
	}
	return m, nil
}
