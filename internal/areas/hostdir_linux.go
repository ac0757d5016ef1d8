//go:build linux

package areas

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Open resolves d once, from a fresh descriptor of its anchor, and returns
// an O_PATH handle on the directory: the caller checks and acts on that
// handle (open_tree on it, openat2 beneath it, /proc/self/fd/N for an API
// that only takes paths) and closes it.
func (d HostDir) Open() (*os.File, error) {
	fd, err := d.open()
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), d.Path), nil
}

func (d HostDir) open() (int, error) {
	rel, err := d.rel()
	if err != nil {
		return -1, err
	}
	anchor := d.anchor()
	afd, err := Openat2(unix.AT_FDCWD, anchor, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, d.describe(fmt.Errorf("opening the directory it is resolved beneath, %s: %w", anchor, err))
	}
	defer unix.Close(afd)
	resolve := uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS)
	switch {
	case d.NoLinks:
		resolve |= unix.RESOLVE_NO_SYMLINKS
	case anchor == "/":
		// Beneath "/" an absolute link means what it means to the host.
		resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	}
	fd, err := Openat2(afd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve})
	if err != nil {
		return -1, d.describe(d.resolveError(err))
	}
	if err := refusePseudoFS(fd); err != nil {
		unix.Close(fd)
		return -1, d.describe(err)
	}
	return fd, nil
}

func (d HostDir) describe(err error) error {
	return fmt.Errorf("host directory %s: %w", d.Path, err)
}

// resolveError says in the product's words why the kernel refused.
func (d HostDir) resolveError(err error) error {
	switch {
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: resolving it leaves %s (a symbolic link with an absolute target or one leading out is refused)", ErrEscape, d.anchor())
	case errors.Is(err, unix.ELOOP) && d.NoLinks:
		return fmt.Errorf("a component is a symbolic link, and none is followed here (an agent can reach this path): %w", err)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("a symbolic link loop or a /proc magic link, which is refused: %w", err)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("the kernel has no openat2 (ENOSYS): %w", ErrUnsupportedPlatform)
	default:
		return err
	}
}

// refusePseudoFS refuses a directory on proc or sysfs: from there a path
// leads into other processes' roots and the kernel's own settings.
func refusePseudoFS(fd int) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("checking its file system: %w", err)
	}
	if st.Type == unix.PROC_SUPER_MAGIC || st.Type == unix.SYSFS_MAGIC {
		return ErrPseudoFS
	}
	return nil
}

// Openat2 is openat2(2), retrying EAGAIN (a rename raced with a lookup
// through "..") and EINTR a bounded number of times.
func Openat2(dirfd int, path string, how *unix.OpenHow) (int, error) {
	var fd int
	var err error
	for range maxRetries {
		fd, err = unix.Openat2(dirfd, path, how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	return fd, err
}

// SameDir says whether the descriptor fd and the directory d resolves to
// now are one object; a tree check compares them instead of stating a path.
func SameDir(fd int, d HostDir) (bool, error) {
	held, err := d.open()
	if err != nil {
		return false, err
	}
	defer unix.Close(held)
	var a, b unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil {
		return false, err
	}
	if err := unix.Fstat(held, &b); err != nil {
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// RealPath is where the kernel resolves path (an administrator's, trusted
// path: its links are followed, magic links never), for matching paths
// written through either name.
func RealPath(path string) (string, error) {
	fd, err := Openat2(unix.AT_FDCWD, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}
