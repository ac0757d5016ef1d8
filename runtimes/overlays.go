package runtimes

import (
	"fmt"
	"slices"
)

// Mounts with mode overlay are kernel overlayfs mounts the driver makes on
// the host (internal/overlay) before the sandbox binds their merged view;
// every backend binds that view like any other mount.

// MountOverlays mounts the overlay mounts of in and unmounts those of prev
// (the configuration the instance had, nil when none) that in no longer
// has. Upper layers, the sandbox's unapplied changes, are never removed.
func MountOverlays(prev *Instance, in Instance) error {
	if prev != nil {
		UnmountOverlays(*prev, in)
	}
	for _, m := range in.Mounts {
		if m.Overlay != nil {
			if err := m.Overlay.Mount(); err != nil {
				return Errorf(ReasonFailed, "ensuring", in.Name, "%w", err)
			}
		}
	}
	return nil
}

// UnmountOverlays unmounts the overlay mounts of in that keep does not use.
func UnmountOverlays(in Instance, keep Instance) {
	for _, m := range in.Mounts {
		if m.Overlay == nil || slices.ContainsFunc(keep.Mounts, func(k Bind) bool { return k.Overlay != nil && k.Overlay.Same(*m.Overlay) }) {
			continue
		}
		_ = m.Overlay.Unmount()
	}
}

// OverlayMountsHealth reports the overlay mounts of an instance: nil when
// it has none; while it runs, each upper layer must exist, be mounted and,
// with a size limit, hold no more than that.
func OverlayMountsHealth(in Instance, running bool) *Health {
	var n int
	for _, m := range in.Mounts {
		if m.Overlay == nil {
			continue
		}
		n++
		if !running {
			continue
		}
		if h := overlayMountHealth(m); h != nil {
			return h
		}
	}
	if n == 0 {
		return nil
	}
	return &Health{Healthy: true, Reason: ReasonHealthy, Message: fmt.Sprintf("%d overlay mount(s) present, mounted and within their limits", n)}
}

func overlayMountHealth(m Bind) *Health {
	l := m.Overlay
	if _, size, sized, err := l.DiskUsage(); sized && (err != nil || size == 0) {
		return &Health{Reason: ReasonNotMounted, Message: fmt.Sprintf("the file system holding the upper layer of overlay mount %s is not mounted at %s (%v)", m.Target, l.Disk, err)}
	}
	if ok, err := l.UpperExists(); err != nil || !ok {
		return &Health{Reason: ReasonSnapshotMissing, Message: fmt.Sprintf("the upper layer %s of overlay mount %s is gone (%v)", l.Upper, m.Target, err)}
	}
	if ok, err := l.Mounted(); err != nil || !ok {
		return &Health{Reason: ReasonNotMounted, Message: fmt.Sprintf("overlay mount %s is not mounted at %s (%v)", m.Target, l.Merged, err)}
	}
	if l.SizeLimit > 0 {
		size, err := l.Size()
		if err != nil {
			return &Health{Reason: ReasonNotMounted, Message: fmt.Sprintf("overlay mount %s: %v", m.Target, err)}
		}
		if size > l.SizeLimit {
			return &Health{Reason: ReasonUpperDirOverLimit, Message: fmt.Sprintf("the upper layer of overlay mount %s holds %d bytes, over its sizeLimit of %d", m.Target, size, l.SizeLimit)}
		}
	}
	return nil
}

// CombineHealth puts the health of a writable root and of the overlay
// mounts together: the first unhealthy one, or both messages when healthy;
// nil when neither has anything to report.
func CombineHealth(root, mounts *Health) *Health {
	switch {
	case root == nil:
		return mounts
	case mounts == nil:
		return root
	case !root.Healthy:
		return root
	case !mounts.Healthy:
		return mounts
	}
	h := *root
	h.Message = root.Message + "; " + mounts.Message
	return &h
}
