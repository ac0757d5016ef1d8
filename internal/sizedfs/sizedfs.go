// Package sizedfs keeps a layer an agent writes to on a file system of a
// fixed size, so a sandbox that writes without end fills that file system
// and not the host's: an ext4 file system in a sparse image file beside the
// layer, attached to a loop device and mounted (nosuid, nodev) where the
// layer lives. The image is the layer's storage: it survives unmounts,
// restarts of the controller and reboots, and goes only with the instance.
//
// Every path is resolved beneath an anchor without following any link
// (areas.HostDir), and the kernel and the e2fsprogs tools are given the held
// objects (a descriptor, /proc/self/fd/N), never a path they would walk
// again.
package sizedfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
)

// ErrUnsupported is wrapped when this host cannot give a layer a file
// system of its own: no loop device can be attached, or the e2fsprogs
// tools are missing.
var ErrUnsupported = errors.New("this host cannot bound a layer's size")

// toolTimeout bounds one run of mkfs, e2fsck, resize2fs or the copy of a
// layer onto its file system.
const toolTimeout = 10 * time.Minute

// MinSize is the smallest file system ext4 can make; a smaller limit is
// refused by admission.
const MinSize = 64 << 10

// FS is one sized file system: its image file and where it is mounted.
type FS struct {
	// Dir is where it is mounted; Image is Dir + ".img".
	Dir string
	// Size is the file system's size in bytes.
	Size int64
	// Anchor is the directory both are resolved beneath.
	Anchor string
}

// Image is the file holding the file system.
func (f FS) Image() string { return f.Dir + ".img" }

func (f FS) held(path string) areas.HostDir {
	return areas.HostDir{Anchor: f.Anchor, Path: path, NoLinks: true}
}

// Mounted says whether the file system is mounted at Dir.
func (f FS) Mounted() (bool, error) {
	m, ok, err := HeldMount(f.Anchor, f.Dir, unix.EXT4_SUPER_MAGIC)
	if ok {
		m.Close()
	}
	return ok, err
}

// HeldMount resolves dir beneath anchor without following any link and
// says whether a file system of type magic is mounted on it. When one is,
// m holds the mount's root: the caller checks and acts on m (Fstatfs,
// UnmountHeld), never on dir again, which the agent who owns the
// directories around it may have made lead elsewhere by then. A dir that
// is missing, or is not a directory (a link put in its place), has
// nothing of ours mounted on it.
func HeldMount(anchor, dir string, magic int64) (m *os.File, ok bool, err error) {
	parent, err := areas.HostDir{Anchor: anchor, Path: filepath.Dir(dir), NoLinks: true}.Open()
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("checking %s: %w", dir, err)
	}
	defer parent.Close()
	fd, err := unix.Openat(int(parent.Fd()), filepath.Base(dir), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("checking %s: %w", dir, err)
	}
	m = os.NewFile(uintptr(fd), dir)
	var st, pst unix.Stat_t
	var sfs unix.Statfs_t
	if err := errors.Join(unix.Fstat(fd, &st), unix.Fstat(int(parent.Fd()), &pst), unix.Fstatfs(fd, &sfs)); err != nil {
		m.Close()
		return nil, false, fmt.Errorf("checking %s: %w", dir, err)
	}
	if st.Dev == pst.Dev || sfs.Type != magic {
		m.Close()
		return nil, false, nil
	}
	return m, true, nil
}

// UnmountHeld detaches the mount whose root m holds (HeldMount) and closes
// m.
func UnmountHeld(m *os.File) error {
	defer m.Close()
	if err := unix.Unmount("/proc/self/fd/"+strconv.Itoa(int(m.Fd())), unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", m.Name(), err)
	}
	return nil
}

// Mount makes the image when it is missing, grows it when Size grew while
// it was not mounted, and mounts it at Dir unless it is mounted already.
// It reports whether the file system was made just now (and so is empty).
// A file system never shrinks: a smaller Size is reported by Usage until
// the layer is emptied.
func (f FS) Mount() (created bool, err error) {
	if ok, err := f.Mounted(); err != nil || ok {
		return false, err
	}
	if f.Size < MinSize {
		return false, fmt.Errorf("a size limit of %d bytes is below the smallest file system (%d bytes)", f.Size, MinSize)
	}
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return false, err
	}
	parent, err := f.held(filepath.Dir(f.Dir)).Open()
	if err != nil {
		return false, err
	}
	defer parent.Close()
	img, created, err := f.openImage(parent)
	if err != nil {
		return false, err
	}
	defer img.Close()
	dir, err := f.held(f.Dir).Open()
	if err != nil {
		return false, err
	}
	defer dir.Close()
	if err := attachAndMount(img, dir); err != nil {
		if created {
			_ = unix.Unlinkat(int(parent.Fd()), filepath.Base(f.Image()), 0)
		}
		return false, err
	}
	return created, nil
}

// openImage opens the image, making or growing it first.
func (f FS) openImage(parent *os.File) (*os.File, bool, error) {
	name := filepath.Base(f.Image())
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	created := false
	if errors.Is(err, unix.ENOENT) {
		fd, err = unix.Openat(int(parent.Fd()), name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		created = err == nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("opening the image of %s: %w", f.Dir, err)
	}
	img := os.NewFile(uintptr(fd), f.Image())
	fail := func(err error) (*os.File, bool, error) {
		img.Close()
		if created {
			_ = unix.Unlinkat(int(parent.Fd()), name, 0)
		}
		return nil, false, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(fmt.Errorf("the image of %s is not a regular file", f.Dir))
	}
	switch {
	case created:
		if err := unix.Ftruncate(fd, f.Size); err != nil {
			return fail(fmt.Errorf("sizing the image of %s: %w", f.Dir, err))
		}
		if err := tool(img, mkfsArgs(f.Size)...); err != nil {
			return fail(err)
		}
	case st.Size < f.Size:
		if err := unix.Ftruncate(fd, f.Size); err != nil {
			return fail(fmt.Errorf("growing the image of %s: %w", f.Dir, err))
		}
		if err := tool(img, "e2fsck", "-f", "-p"); err != nil {
			return fail(err)
		}
		if err := tool(img, "resize2fs"); err != nil {
			return fail(err)
		}
	}
	return img, created, nil
}

// mkfsArgs makes an ext4 file system owned by root: small ones with 1 KiB
// blocks, an inode per 4 KiB and no journal (a journal needs 1,024
// blocks), larger ones with ext4's defaults. Nothing is reserved for root.
func mkfsArgs(size int64) []string {
	args := []string{"mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard"}
	if size < 64<<20 {
		args = append(args, "-b", "1024", "-i", "4096", "-O", "^has_journal")
	}
	return args
}

// tool runs an e2fsprogs tool on the held image, given to it as its
// descriptor 3.
func tool(img *os.File, argv ...string) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("%w: %s is not installed (install e2fsprogs)", ErrUnsupported, argv[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, append(argv[1:], "/proc/self/fd/3")...)
	cmd.ExtraFiles = []*os.File{img}
	out, err := cmd.CombinedOutput()
	// e2fsck exits 1 when it corrected something: the file system is fine.
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && argv[0] == "e2fsck" && ee.ExitCode() == 1 {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("%s on %s: %w: %s", argv[0], img.Name(), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// attachedDevice finds a loop device that backs img already, and holds
// it open so that it can be neither cleared nor given another file while
// the caller mounts it. Unmount is lazy: a file system some other mount
// still holds (a mount tree's clone of an overlay on it) lives on, with
// changes not yet written to the image. Mounting the image through a
// second loop device would give a second, stale file system over the
// same blocks; mounting this device gives the live one.
func attachedDevice(img *os.File) (lfd int, dev string, ok bool) {
	var st unix.Stat_t
	if err := unix.Fstat(int(img.Fd()), &st); err != nil {
		return -1, "", false
	}
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return -1, "", false
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/block", e.Name(), "loop")); err != nil {
			continue // no file attached
		}
		dev := "/dev/" + e.Name()
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		if err == nil && info.Device == st.Dev && info.Inode == st.Ino {
			return fd, dev, true
		}
		unix.Close(fd)
	}
	return -1, "", false
}

// attachAndMount mounts the image on dir: through the loop device that
// backs it already, when one does, or else attached to a free loop
// device, which goes away by itself once the file system is unmounted.
func attachAndMount(img, dir *os.File) error {
	if lfd, dev, ok := attachedDevice(img); ok {
		err := unix.Mount(dev, "/proc/self/fd/"+strconv.Itoa(int(dir.Fd())), "ext4", unix.MS_NOSUID|unix.MS_NODEV, "nodelalloc")
		unix.Close(lfd)
		if err != nil {
			return fmt.Errorf("mounting %s, which holds %s already, on %s: %w", dev, img.Name(), dir.Name(), err)
		}
		return nil
	}
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: opening /dev/loop-control: %w", ErrUnsupported, err)
	}
	defer unix.Close(ctl)
	for range 16 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("%w: finding a free loop device: %w", ErrUnsupported, err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: opening %s: %w", ErrUnsupported, dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(lfd, &cfg)
		if errors.Is(err, unix.EBUSY) {
			unix.Close(lfd) // another attach took it first
			continue
		}
		if err != nil {
			unix.Close(lfd)
			return fmt.Errorf("%w: attaching %s: %w", ErrUnsupported, dev, err)
		}
		// nodelalloc: blocks are taken at write(), so a full file system
		// says ENOSPC to the writer rather than EIO at writeback.
		err = unix.Mount(dev, "/proc/self/fd/"+strconv.Itoa(int(dir.Fd())), "ext4", unix.MS_NOSUID|unix.MS_NODEV, "nodelalloc")
		unix.Close(lfd) // the mount holds the device now; unmounting frees it
		if err != nil {
			return fmt.Errorf("mounting %s on %s: %w", dev, dir.Name(), err)
		}
		return nil
	}
	return fmt.Errorf("%w: no loop device stayed free", ErrUnsupported)
}

// Unmount unmounts the file system; the image stays.
func (f FS) Unmount() error {
	m, ok, err := HeldMount(f.Anchor, f.Dir, unix.EXT4_SUPER_MAGIC)
	if err != nil || !ok {
		return err
	}
	return UnmountHeld(m)
}

// Remove unmounts the file system and removes its image and mount point:
// for an instance that is deleted.
func (f FS) Remove() error {
	if err := f.Unmount(); err != nil {
		return err
	}
	if err := os.Remove(f.Image()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(f.Dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Usage is what the mounted file system holds and can hold, in bytes.
func (f FS) Usage() (used, size int64, err error) {
	m, ok, err := HeldMount(f.Anchor, f.Dir, unix.EXT4_SUPER_MAGIC)
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		return 0, 0, fmt.Errorf("measuring %s: it is not mounted", f.Dir)
	}
	defer m.Close()
	var s unix.Statfs_t
	if err := unix.Fstatfs(int(m.Fd()), &s); err != nil {
		return 0, 0, fmt.Errorf("measuring %s: %w", f.Dir, err)
	}
	return int64(s.Blocks-s.Bfree) * s.Bsize, int64(s.Blocks) * s.Bsize, nil
}

// CopyInto copies the tree at from, as it is (links as links, devices such
// as overlayfs whiteouts as devices, owners, modes and extended attributes
// kept), into the directory into: a layer that had no size limit moving
// onto its file system. Neither may be reachable by an agent while it runs.
// A failure says the first maxCopyOutput bytes of what cp printed: it
// prints a line for every file that does not fit, and the agent chose how
// many files there are and how long their names.
func CopyInto(from, into string) error {
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	out := boundedbuf.New(maxCopyOutput)
	cmd := exec.CommandContext(ctx, "cp", "-a", "--no-dereference", "--preserve=all", "--", from+"/.", into)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("moving the layer %s onto its sized file system: %w: %s", from, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// maxCopyOutput bounds what CopyInto keeps of cp's output.
const maxCopyOutput = 4 << 10
