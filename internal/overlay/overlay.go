// Package overlay gives a mount with mode "overlay" its layers: the host
// source is the read-only lower layer, the sandbox's writes land in a
// per-sandbox upper directory, and the merged view is what the sandbox
// sees. Nothing reaches the host source until someone applies the change
// (Apply), and Apply writes through internal/areas, so a symbolic link the
// sandbox left in the upper layer never leads outside the source.
//
// The merged view is a kernel overlayfs mount made by the controller (it
// needs CAP_SYS_ADMIN); it never mounts anything over the source itself.
package overlay

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/sizedfs"
)

// Layers are one overlay mount's directories on the host.
type Layers struct {
	// Lower is the host source, never written.
	Lower string `json:"lower"`
	// Upper holds the sandbox's changes; Work is overlayfs's scratch space.
	Upper string `json:"upper"`
	Work  string `json:"work"`
	// Merged is where the overlay is mounted and what the sandbox binds.
	Merged string `json:"merged"`
	// SizeLimit, when above zero, is the most the upper layer should hold,
	// in bytes; Size says how much it holds.
	SizeLimit int64 `json:"sizeLimit,omitempty"`
	// Owner, when not 0, is the agent's host id: the upper layer's root,
	// which the merged view's root shows, belongs to it so the agent can
	// create files there.
	Owner uint32 `json:"owner,omitempty"`
	// LowerAnchor and LowerNoLinks say how Lower is resolved on every
	// act (areas.HostDir): beneath the SandboxClass root that allows it,
	// "" for "/".
	LowerAnchor  string `json:"lowerAnchor,omitempty"`
	LowerNoLinks bool   `json:"lowerNoLinks,omitempty"`
	// Disk, when set, is where the file system of SizeLimit bytes that
	// holds Upper and Work is mounted (Sized).
	Disk string `json:"disk,omitempty"`
}

// Sized gives the layers a file system of limit bytes of their own
// (internal/sizedfs): the upper and work directories move onto it, so the
// sandbox's changes stop at that size instead of filling the host.
func (l Layers) Sized(limit int64) Layers {
	base := filepath.Dir(l.Merged)
	l.SizeLimit = limit
	l.Disk = filepath.Join(base, "disk")
	l.Upper = filepath.Join(l.Disk, "upper")
	l.Work = filepath.Join(l.Disk, "work")
	return l
}

// disk is the sized file system of the layers; Dir is "" when they have none.
func (l Layers) disk() sizedfs.FS {
	if l.Disk == "" {
		return sizedfs.FS{}
	}
	return sizedfs.FS{Dir: l.Disk, Size: l.SizeLimit, Anchor: l.areasRoot()}
}

// DiskUsage is what the sized file system holds and can hold; ok is false
// for layers without one.
func (l Layers) DiskUsage() (used, size int64, ok bool, err error) {
	if l.Disk == "" {
		return 0, 0, false, nil
	}
	switch ok, err := l.disk().Mounted(); {
	case err != nil:
		return 0, 0, true, err
	case !ok:
		return 0, 0, true, fmt.Errorf("%s is not mounted", l.Disk)
	}
	used, size, err = l.disk().Usage()
	return used, size, true, err
}

// mountDisk mounts the sized file system, if the layers have one, and
// makes the upper and work directories on it. The first time, changes
// made before the size limit was set (in the plain upper directory) move
// onto it, and that directory is renamed upper.moved.
func (l Layers) mountDisk() error {
	if l.Disk == "" {
		return nil
	}
	created, err := l.disk().Mount()
	if err != nil {
		return fmt.Errorf("giving overlay %s its sizeLimit of %d bytes: %w", l.Merged, l.SizeLimit, err)
	}
	if !created {
		return nil
	}
	for _, d := range []string{l.Upper, l.Work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	old := filepath.Join(filepath.Dir(l.Merged), "upper")
	if fi, err := os.Lstat(old); err == nil && fi.IsDir() {
		if err := sizedfs.CopyInto(old, l.Upper); err != nil {
			// The old layer is untouched; a half-filled new one would
			// hide it for good, so it goes and the next mount tries again.
			return errors.Join(fmt.Errorf("overlay %s: the changes made before its sizeLimit of %d bytes could not move onto it (do they fit?): %w", l.Merged, l.SizeLimit, err), l.disk().Remove())
		}
		return os.Rename(old, old+".moved")
	}
	return nil
}

// LowerDir is the lower layer as the held object every act resolves.
func (l Layers) LowerDir() areas.HostDir {
	return areas.HostDir{Anchor: l.LowerAnchor, Path: l.Lower, NoLinks: l.LowerNoLinks}
}

// layerDir is one of the directories For placed below the agent's
// directory, resolved beneath the areas root without following any link.
func (l Layers) layerDir(path string) areas.HostDir {
	return areas.HostDir{Anchor: l.areasRoot(), Path: path, NoLinks: true}
}

// areasRoot is the areas root, four levels above
// <agentDir>/.overlay/<target>/upper (or disk, when sized).
func (l Layers) areasRoot() string {
	below := l.Upper
	if l.Disk != "" {
		below = l.Disk
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(below))))
}

// UpperDir is the upper layer as a held object.
func (l Layers) UpperDir() areas.HostDir { return l.layerDir(l.Upper) }

// Same says whether two Layers are the same overlay: the same directories,
// whatever their size limits.
func (l Layers) Same(o Layers) bool {
	return l.Lower == o.Lower && l.Upper == o.Upper && l.Work == o.Work && l.Merged == o.Merged && l.Disk == o.Disk
}

// UpperExists says whether the upper layer is a directory.
func (l Layers) UpperExists() (bool, error) {
	fi, err := os.Stat(l.Upper)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fi.IsDir(), nil
}

// For returns the layers of the overlay mount at target (relative to
// /workspace) of the agent whose directory is agentDir. The directories live
// in <agentDir>/.overlay/, beside the areas and never inside one, so the
// sandbox cannot reach its own upper layer except through the merged view.
func For(agentDir, source, target string) Layers {
	base := filepath.Join(agentDir, ".overlay", url.PathEscape(target))
	return Layers{
		Lower:  source,
		Upper:  filepath.Join(base, "upper"),
		Work:   filepath.Join(base, "work"),
		Merged: filepath.Join(base, "merged"),
	}
}

// Mounted reports whether an overlay is mounted at l.Merged.
func (l Layers) Mounted() (bool, error) {
	m, ok, err := sizedfs.HeldMount(l.areasRoot(), l.Merged, unix.OVERLAYFS_SUPER_MAGIC)
	if ok {
		m.Close()
	}
	return ok, err
}

// Mount creates the upper, work and merged directories when missing and
// mounts the overlay unless it is mounted already. Every layer is resolved
// once, as a held directory (the lower one beneath its anchor, the others
// beneath the areas root without links), and the kernel is given those
// descriptors (/proc/self/fd/N), never a path it would walk again.
func (l Layers) Mount() error {
	if ok, err := l.Mounted(); err != nil || ok {
		return err
	}
	lower, err := l.LowerDir().Open()
	if err != nil {
		return fmt.Errorf("mounting overlay of %s: the source must be an existing directory: %w", l.Lower, err)
	}
	defer lower.Close()
	if err := l.mountDisk(); err != nil {
		return err
	}
	for _, d := range []string{l.Upper, l.Work, l.Merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("mounting overlay of %s: %w", l.Lower, err)
		}
	}
	var held [3]*os.File
	for i, d := range []string{l.Upper, l.Work, l.Merged} {
		f, err := l.layerDir(d).Open()
		if err != nil {
			return fmt.Errorf("mounting overlay of %s: %w", l.Lower, err)
		}
		defer f.Close()
		held[i] = f
	}
	upper, work, merged := held[0], held[1], held[2]
	if l.Owner != 0 {
		if err := unix.Fchownat(int(upper.Fd()), "", int(l.Owner), int(l.Owner), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("mounting overlay of %s: giving its upper layer to the agent: %w", l.Lower, err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", fdPath(lower), fdPath(upper), fdPath(work))
	if err := unix.Mount("overlay", fdPath(merged), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting overlay of %s at %s: %w", l.Lower, l.Merged, err)
	}
	return nil
}

// fdPath names a held directory for a system call that takes only paths:
// the kernel follows the descriptor's link to the object itself.
func fdPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

// Unmount unmounts the merged view, and the sized file system under it;
// the upper layer (the changes) stays.
func (l Layers) Unmount() error {
	m, ok, err := sizedfs.HeldMount(l.areasRoot(), l.Merged, unix.OVERLAYFS_SUPER_MAGIC)
	if err != nil {
		return err
	}
	if ok {
		if err := sizedfs.UnmountHeld(m); err != nil {
			return fmt.Errorf("overlay: %w", err)
		}
	}
	if l.Disk != "" {
		return l.disk().Unmount()
	}
	return nil
}

// Size is the bytes the upper layer holds, for the size limit of
// OverlayHealthy.
//
// The layer is the agent's to change while it is measured (through the
// merged view), and the controller measures it as root: it is walked by
// descriptor, each directory opened beneath the one before without
// following a link, so a directory swapped for a link to the host's tree
// between its listing and its opening is refused, never walked; its
// names are read a batch at a time, and the walk stops past
// maxSizeDepth directories. An error names no entry of the layer.
func (l Layers) Size() (int64, error) {
	fd, err := unix.Open(l.Upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("measuring the upper layer %s: %w", l.Upper, err)
	}
	total, err := dirSize(fd, 0)
	if err != nil {
		return 0, fmt.Errorf("measuring the upper layer %s: %w", l.Upper, err)
	}
	return total, nil
}

// maxSizeDepth bounds how deep Size walks an upper layer.
const maxSizeDepth = 1024

// errTooDeep is an upper layer deeper than Size walks.
var errTooDeep = fmt.Errorf("it is more than %d directories deep", maxSizeDepth)

// dirSize is the bytes of the regular files below the directory fd, which
// it closes. Entries that go while it reads are skipped.
func dirSize(fd int, depth int) (int64, error) {
	d := os.NewFile(uintptr(fd), "upper")
	defer d.Close()
	if depth > maxSizeDepth {
		return 0, errTooDeep
	}
	var total int64
	for {
		names, rerr := d.Readdirnames(512)
		for _, n := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return 0, err
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				total += st.Size
			case unix.S_IFDIR:
				sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					// Gone, or no longer a directory (a link now): what
					// it holds is not the layer's.
					if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
						continue
					}
					return 0, err
				}
				n, err := dirSize(sub, depth+1)
				if err != nil {
					return 0, err
				}
				total += n
			}
		}
		if rerr != nil || len(names) == 0 {
			if rerr == nil || errors.Is(rerr, io.EOF) {
				return total, nil
			}
			return 0, rerr
		}
	}
}
