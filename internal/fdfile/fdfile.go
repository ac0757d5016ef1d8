// Package fdfile reads and writes the small files the drivers read at
// every pass and command (instance records, cgroup interface files)
// through their descriptor alone. os.ReadFile and os.WriteFile add six
// system calls to each such file: the runtime's poller tries the
// descriptor and is refused, and the file's size is asked for. Lock holds
// an exclusive lock on a file or a directory.
package fdfile

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
)

// Read appends the file at path to buf and returns buf: the file to its
// end, refused past max bytes (nil with every error). With printedWhole (a kernel file printed
// whole at each read, as a cgroup's seq_file is) a read that leaves room
// in buf is the end, and no second read is made only to be told so.
// Pass a buffer with room for the usual size: it is grown as needed.
func Read(path string, buf []byte, max int, printedWhole bool) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if len(buf) > max {
			return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("larger than the %d bytes such a file can hold", max)}
		}
		if printedWhole && len(buf) < cap(buf) {
			return buf, nil
		}
	}
}

// Write writes b to the existing file at path in one write.
func Write(path string, b []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for {
		_, err = unix.Write(fd, b)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// Lock opens path with flags (O_CLOEXEC is added; mode for a file
// O_CREAT makes) and holds an exclusive flock on it until the returned
// function is called. flags decide what path may be: a lock file
// (O_RDWR|O_CREAT|O_NOFOLLOW) or a directory (O_RDONLY|O_DIRECTORY).
func Lock(path string, flags int, mode uint32) (func(), error) {
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, fmt.Errorf("opening %s to lock it: %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { unix.Close(fd) }, nil
}
