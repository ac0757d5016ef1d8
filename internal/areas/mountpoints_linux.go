//go:build linux

package areas

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMountPoint is matched (errors.Is) by every *MountPointError.
var ErrMountPoint = errors.New("a mount point of the sandbox")

// MountPointError reports a removal refused because the directory is, or
// holds, the mount point of another area or mount inside the sandbox:
// removing it would take the mount from under running commands and let the
// agent put a link where the mount was.
type MountPointError struct {
	// Path is the sandbox path the caller asked to remove.
	Path string
	// Mount is the sandbox path of the mount it is or holds.
	Mount string
}

func (e *MountPointError) Error() string {
	if e.Path == e.Mount {
		return fmt.Sprintf("refusing to remove %s: it is %v", e.Path, ErrMountPoint)
	}
	return fmt.Sprintf("refusing to remove %s: it holds %s, %v", e.Path, e.Mount, ErrMountPoint)
}

func (e *MountPointError) Is(target error) bool { return target == ErrMountPoint }

// dirID is a directory's identity on the host.
type dirID struct{ dev, ino uint64 }

// mountPoints maps the directories that are mount points of nested roots
// (a custom mount below /workspace) to the mount's sandbox path. Each is
// found through its parent root without following links: the directory
// that really is the mount point, not the one a link names.
func (v *View) mountPoints() map[dirID]string {
	ids := map[dirID]string{}
	for _, m := range v.mounts {
		parent, rel, ok := v.parentOf(m.point)
		if !ok {
			continue
		}
		root, err := parent.openRoot("inspecting", rel)
		if err != nil {
			continue
		}
		fd, err := parent.sys.openat2(root, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		unix.Close(root)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			ids[dirID{st.Dev, st.Ino}] = m.point
		}
		unix.Close(fd)
	}
	return ids
}

// parentOf is the root holding the mount point of another root, and the
// mount point relative to it.
func (v *View) parentOf(point string) (*Root, string, bool) {
	for _, m := range v.mounts {
		if rest, ok := strings.CutPrefix(point, m.point+"/"); ok {
			return m.root, rest, true
		}
	}
	return nil, "", false
}

// Remove removes the file or directory at a sandbox path, as Root.Remove
// does, but refuses, removing nothing, when the directory is the mount
// point of another area or mount, or holds one at any depth, whatever
// links the path went through. The kernel refuses to remove a directory
// that is a mount point of the controller's namespace too; this check
// makes the refusal whole (nothing below is removed first) and names it.
func (v *View) Remove(sandboxPath string, recursive bool) error {
	root, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return err
	}
	points := v.mountPoints()
	return root.act(func() error {
		if len(points) > 0 {
			if err := root.checkNoMountPoint(rel, points, path.Clean(sandboxPath)); err != nil {
				return err
			}
		}
		return root.remove(rel, recursive)
	})
}

// maxMountPointScan bounds the walk that looks for mount points below a
// directory about to be removed.
const maxMountPointScan = 100000

func (r *Root) checkNoMountPoint(rel string, points map[dirID]string, shown string) error {
	const op = "removing"
	fd, err := r.at(op, rel, rel, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return r.wrap(op, rel, err)
	}
	if m, ok := points[dirID{st.Dev, st.Ino}]; ok {
		return &MountPointError{Path: shown, Mount: m}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	budget := maxMountPointScan
	return scanForMountPoints(fd, points, shown, &budget)
}

func scanForMountPoints(dirfd int, points map[dirID]string, shown string, budget *int) error {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reading %s: %w", shown, err)
	}
	d := os.NewFile(uintptr(fd), shown)
	defer d.Close()
	for {
		names, err := d.Readdirnames(1024)
		for _, n := range names {
			if *budget--; *budget < 0 {
				return fmt.Errorf("refusing to remove %s: more than %d entries to check for mount points", shown, maxMountPointScan)
			}
			var st unix.Stat_t
			if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			if m, ok := points[dirID{st.Dev, st.Ino}]; ok {
				return &MountPointError{Path: shown, Mount: m}
			}
			sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			err = scanForMountPoints(sub, points, shown, budget)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || len(names) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", shown, err)
		}
	}
}
