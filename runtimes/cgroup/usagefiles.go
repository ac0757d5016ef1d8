//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"golang.org/x/sys/unix"
)

// usageFiles keeps the interface files of each instance whose usage was
// read open, so that reading it again (every pass of its Sandbox, every
// health interval, every metrics scrape) is one pread a file instead of
// an open, a read and a close. On these hosts opening a cgroup file is
// most of what reading one costs (BenchmarkUsage), and at 10,000 running
// instances the usage watcher alone read 50,000 files every interval.
//
// The descriptors are the controller's, opened close-on-exec: nothing it
// starts inherits them. An instance's files are closed when its cgroup is
// made again (Ensure) or removed (Remove); a read through them that fails
// (the cgroup went another way) closes them and reads the files by path,
// so the caller sees what reading by path says. At most limit instances
// keep files open, a quarter of the descriptors the process may hold;
// the others are read by path.
type usageFiles struct {
	mu     sync.Mutex
	byName map[string]*openFiles
	limit  int
}

// openFiles are one instance's open interface files, in the order a
// usage read reads them (readUsageWith reads the same files of the same
// cgroup in the same order every time, so the n-th file read is the n-th
// kept; TestUsageReadsTheSameFilesInTheSameOrder holds readUsageWith to
// that. No path is kept, which at 10,000 instances was megabytes).
type openFiles struct {
	mu     sync.Mutex
	fds    [filesPerInstance]int
	opened int
	// next is the file the read under way is at.
	next int
	// openFailed says the read under way failed opening a file by its
	// path: its error is the one a read by path gives.
	openFailed bool
	closed     bool
}

// filesPerInstance is how many interface files a usage read opens at most
// (five, and six on v2 where it accounts swap, on v1 where a TCP limit
// is set).
const filesPerInstance = 6

// newUsageFiles sizes the cache by the process's descriptor limit.
func newUsageFiles() *usageFiles {
	var rl unix.Rlimit
	limit := 0
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		limit = int(min(rl.Cur/4/filesPerInstance, 1<<20))
	}
	return &usageFiles{byName: map[string]*openFiles{}, limit: limit}
}

// take is instance name's open files, new when it has none; nil when the
// cache is full.
func (u *usageFiles) take(name string) *openFiles {
	u.mu.Lock()
	defer u.mu.Unlock()
	if f, ok := u.byName[name]; ok {
		return f
	}
	if len(u.byName) >= u.limit {
		return nil
	}
	f := &openFiles{}
	u.byName[name] = f
	return f
}

// drop closes instance name's files, if it has any open.
func (u *usageFiles) drop(name string) {
	u.mu.Lock()
	f, ok := u.byName[name]
	delete(u.byName, name)
	u.mu.Unlock()
	if ok {
		f.close()
	}
}

// dropIf closes f and forgets it, unless name has other files by now.
func (u *usageFiles) dropIf(name string, f *openFiles) {
	u.mu.Lock()
	if u.byName[name] == f {
		delete(u.byName, name)
	}
	u.mu.Unlock()
	f.close()
}

// count is how many instances keep files open.
func (u *usageFiles) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.byName)
}

func (f *openFiles) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closeLocked()
}

func (f *openFiles) closeLocked() {
	for _, fd := range f.fds[:f.opened] {
		_ = unix.Close(fd)
	}
	f.opened, f.closed = 0, true
}

// readAll reads a usage through f: readUsageWith with f.read. byPath
// says a failure was in opening a file by its path, which a read by path
// would meet the same way (a stopped instance has no cgroup).
func (f *openFiles) readAll(v2, swap, tcp bool, dir func(c string) string) (u Usage, byPath bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next, f.openFailed = 0, false
	u, err = readUsageWith(v2, swap, tcp, dir, f.read)
	return u, f.openFailed, err
}

// errClosed says the files were closed under the reader: read by path.
var errClosed = errors.New("the cgroup's open files were closed")

// read reads the next interface file, at path, from offset 0, opening it
// the first time. The caller holds f.mu.
func (f *openFiles) read(path string) (string, error) {
	if f.closed {
		return "", errClosed
	}
	i := f.next
	f.next++
	switch {
	case i >= len(f.fds):
		return "", fmt.Errorf("reading %s: more than the %d files a usage reads", path, len(f.fds))
	case i == f.opened:
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			f.openFailed = true
			return "", &fs.PathError{Op: "open", Path: path, Err: err}
		}
		f.fds[i] = fd
		f.opened++
	}
	fd := f.fds[i]
	// A read at offset 0 makes the kernel print the file anew.
	var buf [1024]byte
	for {
		n, err := unix.Pread(fd, buf[:], 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return "", &fs.PathError{Op: "read", Path: path, Err: err}
		case n == len(buf):
			return "", &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("larger than the %d bytes a usage file holds", len(buf))}
		}
		return string(buf[:n]), nil
	}
}
