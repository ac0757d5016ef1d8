package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// writeLocal replaces the host file dst with what src holds, at most
// maxCopy bytes, as one step: the bytes go to a new file beside dst, which
// is renamed over dst only once all of them are there. A copy that fails
// part way (a stream cut, Ctrl-C, a file larger than the limit) leaves dst
// as it was and no part file behind. The file's size and contents come
// from the sandbox, so neither is trusted to be small. dst's directory is
// opened once and everything is done in it: a link at dst is replaced, not
// written through, and an existing regular file keeps its permission bits.
func writeLocal(dst string, src io.Reader) error {
	d, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer d.Close()
	return writeLocalAt(d, filepath.Base(dst), src)
}

// writeLocalAt is writeLocal of the entry base of the open directory d.
func writeLocalAt(d *os.File, base string, src io.Reader) (err error) {
	dst := filepath.Join(d.Name(), base)
	dfd := int(d.Fd())
	mode, keepMode := uint32(0o666), false // less the umask, as os.Create makes it
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT == unix.S_IFREG:
		mode, keepMode = st.Mode&0o777, true
	case st.Mode&unix.S_IFMT != unix.S_IFLNK:
		return fmt.Errorf("%s is not a regular file", dst)
	}
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	part := "." + base + ".part-" + hex.EncodeToString(suffix)
	fd, err := unix.Openat(dfd, part, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("creating a part file beside %s: %w", dst, err)
	}
	out := os.NewFile(uintptr(fd), part)
	defer func() {
		if err != nil {
			out.Close()
			_ = unix.Unlinkat(dfd, part, 0)
		}
	}()
	n, err := io.Copy(out, io.LimitReader(src, maxCopy+1))
	if err != nil {
		return err
	}
	if n > maxCopy {
		return errTooLarge
	}
	if keepMode {
		if err := out.Chmod(fs.FileMode(mode)); err != nil {
			return err
		}
	}
	if err := out.Close(); err != nil {
		return err
	}
	return unix.Renameat(dfd, part, dfd, base)
}

// errAgentsLink is a link met on the way to a host destination, in a
// directory the sandbox can write.
var errAgentsLink = errors.New("a symbolic link in a directory the sandbox can write, which the agent chooses where it leads; give the path without it")

// sandboxWritable are the host directories the sandbox can write: its
// read-write areas and mounts, as the driver holds them.
func sandboxWritable(in runtimes.Instance) []os.FileInfo {
	var out []os.FileInfo
	for _, w := range in.WritableSources() {
		out = append(out, w.Dir)
	}
	return out
}

// openHostDir opens the host directory path as the kernel would resolve
// it, but one component at a time, and refuses a link met in a directory
// the sandbox can write (one of writable, or below one): there the agent
// makes links, and a copy that followed them would land wherever it
// liked on the host. Links elsewhere (the user's) are followed. It says
// whether the directory is one the sandbox can write.
func openHostDir(path string, writable []os.FileInfo) (*os.File, bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, false, err
	}
	type step struct {
		fd     int
		inside bool
	}
	var stack []step
	defer func() {
		for _, s := range stack {
			unix.Close(s.fd)
		}
	}()
	isWritable := func(fd int) (bool, error) {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return false, err
		}
		for _, w := range writable {
			if ws, ok := w.Sys().(*syscall.Stat_t); ok && ws.Dev == st.Dev && ws.Ino == st.Ino {
				return true, nil
			}
		}
		return false, nil
	}
	push := func(fd int, parentInside bool) error {
		in, err := isWritable(fd)
		if err != nil {
			unix.Close(fd)
			return err
		}
		stack = append(stack, step{fd, parentInside || in})
		return nil
	}
	root := func() error {
		for _, s := range stack {
			unix.Close(s.fd)
		}
		stack = nil
		fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return push(fd, false)
	}
	if err := root(); err != nil {
		return nil, false, err
	}
	rest, links := strings.Split(abs, "/"), 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) > 1 {
				unix.Close(stack[len(stack)-1].fd)
				stack = stack[:len(stack)-1]
			}
			continue
		}
		top := stack[len(stack)-1]
		fd, err := unix.Openat(top.fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, false, &os.PathError{Op: "open", Path: abs, Err: err}
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, false, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := push(fd, top.inside); err != nil {
				return nil, false, err
			}
			continue
		case unix.S_IFLNK:
		default:
			unix.Close(fd)
			return nil, false, &os.PathError{Op: "open", Path: abs, Err: unix.ENOTDIR}
		}
		unix.Close(fd)
		if top.inside {
			return nil, false, fmt.Errorf("%s: %q is %w", abs, c, errAgentsLink)
		}
		if links++; links > maxLinks {
			return nil, false, &os.PathError{Op: "open", Path: abs, Err: unix.ELOOP}
		}
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(top.fd, c, buf)
		if err != nil {
			return nil, false, &os.PathError{Op: "readlink", Path: abs, Err: err}
		}
		target := string(buf[:n])
		if filepath.IsAbs(target) {
			if err := root(); err != nil {
				return nil, false, err
			}
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	top := stack[len(stack)-1]
	fd, err := unix.Openat(top.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, &os.PathError{Op: "open", Path: abs, Err: err}
	}
	return os.NewFile(uintptr(fd), abs), top.inside, nil
}

// localDestination opens the directory a copy out to hostPath writes in,
// and names the entry it writes there: hostPath itself, or, when hostPath
// is a directory (or ends in a slash), name in it. The way there never follows a link the
// sandbox can change (openHostDir); a link at hostPath itself is replaced
// by the copy when the sandbox can change it, as it always is when it
// does not lead to a directory.
func localDestination(hostPath, name string, writable []os.FileInfo) (*os.File, string, error) {
	abs, err := filepath.Abs(hostPath)
	if err != nil {
		return nil, "", err
	}
	if strings.HasSuffix(hostPath, "/") {
		// A directory, as the user wrote it.
		d, _, err := openHostDir(abs, writable)
		return d, name, err
	}
	parent, inside, err := openHostDir(filepath.Dir(abs), writable)
	if err != nil {
		return nil, "", err
	}
	base := filepath.Base(abs)
	// Into a directory there, or one a link of the user's leads to;
	// anything else (nothing yet, a file, the agent's link) is replaced by
	// the copy, as base in parent.
	var st unix.Stat_t
	statErr := unix.Fstatat(int(parent.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if intoDir := statErr == nil && (st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Mode&unix.S_IFMT == unix.S_IFLNK && !inside); !intoDir {
		return parent, base, nil
	}
	d, _, err := openHostDir(abs, writable)
	switch {
	case err == nil:
		parent.Close()
		return d, name, nil
	case errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOENT):
		// A link to no directory: replaced, as before.
		return parent, base, nil
	}
	parent.Close()
	return nil, "", err
}

// openHostFile opens the host file path for reading, without following a
// link the sandbox can change on the way (openHostDir) or at path itself,
// and without waiting on a FIFO: the caller checks what it opened.
func openHostFile(path string, writable []os.FileInfo) (*os.File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	d, inside, err := openHostDir(filepath.Dir(abs), writable)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	if inside {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Openat(int(d.Fd()), filepath.Base(abs), flags, 0)
	if errors.Is(err, unix.ELOOP) && inside {
		return nil, fmt.Errorf("%s is %w", abs, errAgentsLink)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: abs, Err: err}
	}
	return os.NewFile(uintptr(fd), abs), nil
}

// errTooLarge is a copy past the limit of one copy.
var errTooLarge = fmt.Errorf("more than the %d-byte limit of one copy", maxCopy)

// tooLarge says whether a copy of size bytes passes the limit.
func tooLarge(size int64) error {
	if size > maxCopy {
		return fmt.Errorf("%d bytes is %w", size, errTooLarge)
	}
	return nil
}

// displayName is a file name as a terminal may show it: quoted, with its
// control characters escaped, when it holds any (or is not UTF-8, or
// begins with a quote). Names come from the sandbox: one with a newline
// would print as two entries, one with an escape sequence would command
// the terminal.
func displayName(name string) string {
	if strings.HasPrefix(name, `"`) || !utf8.ValidString(name) {
		return strconv.Quote(name)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return strconv.Quote(name)
		}
	}
	return name
}
