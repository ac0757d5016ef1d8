// Package startns makes the mount namespaces commands start in: of the
// host's mounts of that moment, those the start needs (host.go), or all
// of them less the mount trees, and the tree mounts the command needs.
package startns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/mountinfo"
	"github.com/cireilclaw/sandbox-controller/internal/osthread"
)

// bubblewrap starts by copying the mount namespace it is started in, and
// reads the whole mount table again for every read-only bind it makes (a
// policy makes about twenty). Started in the host's namespace, it copies
// and reads every mount tree of every instance on the host: with 5,000
// such mounts (some 800 running instances) a command took 170 ms to start
// instead of 6.
//
// So a command starts in a mount namespace of its own, made for it: a
// clone of the host's mounts without the mount trees (their directory is
// unbindable, so a clone leaves it out), and this instance's tree alone,
// cloned from the host's and attached at the same paths on a tmpfs of its
// own. bubblewrap's arguments are the same; what it copies and reads no
// longer grows with the other instances. The clone is taken at every
// start, so the command sees the host's mounts of that moment, as before.
//
// A namespace can only be made by copying the caller's, so the copy is
// taken from a seed: a namespace made once by the process, holding one
// empty tmpfs. The clone of the host's mounts is then put in as its root.
// The controller's host git jail (internal/worktree) starts the same way,
// with no tree mount.
//
// Everything happens on a thread that has left the process's shared file
// system state (CLONE_FS): the command is forked from it, and it ends
// with the command (its goroutine never unlocks it): bubblewrap dies with
// the thread that started it (--die-with-parent), so the thread lives as
// long as the command.

// Namespaces makes start namespaces.
type Namespaces struct {
	// top is the directory holding the mount trees (unbindable on the
	// host): in a start namespace, a tmpfs holding the command's tree
	// mounts alone. Empty: the command needs no tree mount.
	top string
	// drop are directories whose mounts a start namespace goes without,
	// detached from it once cloned.
	drop []string
}

// New returns the maker of start namespaces whose tree mounts are below
// top (an unbindable mount on the host, mounttree.MakeTreesMount), or
// none when top is empty. A start namespace goes without the mounts at
// and below each of drop: mounts that cannot be made unbindable on the
// host (a mount that receives the host's, such as the node runtime's
// directory of containers' root file systems, one mount a container) and
// that no command needs from there.
func New(top string, drop ...string) *Namespaces {
	if top != "" {
		top = filepath.Clean(top)
	}
	s := &Namespaces{top: top}
	for _, d := range drop {
		if d != "" {
			s.drop = append(s.drop, filepath.Clean(d))
		}
	}
	return s
}

// The seed is made once for the process: a namespace can only be made by
// copying the caller's, and the copy of one holding a single empty tmpfs
// costs nothing, where the host's may hold thousands of mounts.
var seeds = seedKeeper{make: makeSeed, retry: time.Minute}

// seedKeeper holds the seed. A seed that could not be made is tried
// again, no more often than retry: a passing failure (out of descriptors
// or memory) must not send a long-lived controller's commands to the
// host's namespace for good, nor a lasting one (no open_tree) cost every
// command a try.
type seedKeeper struct {
	make  func() (int, error)
	retry time.Duration

	mu    sync.Mutex
	fd    int
	ok    bool
	err   error
	tried time.Time
}

// get returns the seed's descriptor, or why there is none.
func (k *seedKeeper) get(now time.Time) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ok {
		return k.fd, nil
	}
	if k.tried.IsZero() || now.Sub(k.tried) >= k.retry {
		k.tried = now
		fd, err := k.make()
		if err == nil {
			k.fd, k.ok = fd, true
			return fd, nil
		}
		k.err = err
	}
	return -1, k.err
}

// ErrUnavailable marks a start namespace that could not be made: the
// command was not started and may start in the host's namespace.
var ErrUnavailable = errors.New("no start namespace")

// Run calls fn on a thread of its own in a new start namespace holding
// the host's mounts (less the trees and the dropped) and the tree mounts
// (paths below top, each a mount), and returns what fn returns; before,
// still in the host's mount namespace, the thread calls pre unless it is
// nil. fn starts its command and waits for it there: the thread ends
// after fn, and a command that dies with its parent thread (bubblewrap's
// --die-with-parent) would die with it. An error wrapping ErrUnavailable
// means fn was not called; pre's own error is returned as it is.
func (s *Namespaces) Run(mounts []string, pre, fn func() error) error {
	return s.RunWith(mounts, nil, pre, fn)
}

// RunWith is Run in a start namespace holding, of the host's mounts, what
// host needs (see Host) instead of all of them; nil host: all of them.
func (s *Namespaces) RunWith(mounts []string, host *Host, pre, fn func() error) error {
	seed, err := seeds.get(time.Now())
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	for _, m := range mounts {
		if s.top == "" || !strings.HasPrefix(m, s.top+"/") {
			return fmt.Errorf("%w: %s is not below the trees' directory %q", ErrUnavailable, m, s.top)
		}
	}
	return osthread.Disposable(func() error {
		if pre != nil {
			if err := pre(); err != nil {
				return err
			}
		}
		if err := s.enter(seed, outermost(mounts), host); err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fn()
	})
}

// outermost is paths without those at or below another of them, the
// shorter first.
func outermost(paths []string) []string {
	sorted := append([]string(nil), paths...)
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i]) < len(sorted[j]) })
	var out []string
	for _, p := range sorted {
		if !slices.ContainsFunc(out, func(o string) bool { return p == o || strings.HasPrefix(p, o+"/") }) {
			out = append(out, p)
		}
	}
	return out
}

// enter moves the calling thread, locked and in the host's mount
// namespace, into a new start namespace.
func (s *Namespaces) enter(seed int, areas []string, host *Host) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("leaving the process's file system state: %w", err)
	}
	// The clones are taken here, in the host's namespace, each from a
	// descriptor: the root (all of it, or what host needs), and each tree
	// mount reached beneath the trees' directory without following a
	// link.
	var plan *hostPlan
	if host != nil {
		var also []string
		if len(areas) > 0 {
			// The way to the trees' directory, where the tree mounts go.
			also = append(also, filepath.Dir(s.top))
		}
		p, some, err := planHost(host, also, s.top)
		if err != nil {
			return err
		}
		if some {
			plan = p
			defer plan.close()
		}
	}
	var root int
	if plan != nil {
		root = plan.root
	} else {
		slash, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening /: %w", err)
		}
		if root, err = cloneMount(slash, "/"); err != nil {
			return err
		}
		defer unix.Close(root)
	}
	clones := make([]int, 0, len(areas))
	defer func() {
		for _, fd := range clones {
			unix.Close(fd)
		}
	}()
	if len(areas) > 0 {
		top, err := unix.Open(s.top, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening the trees' directory %s: %w", s.top, err)
		}
		defer unix.Close(top)
		for _, a := range areas {
			at, err := unix.Openat2(top, s.rel(a), beneath)
			if err != nil {
				return fmt.Errorf("opening %s beneath %s: %w", a, s.top, err)
			}
			fd, err := cloneMount(at, a)
			if err != nil {
				return err
			}
			clones = append(clones, fd)
		}
	}
	if err := unix.Setns(seed, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("entering the seed mount namespace: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("making a mount namespace: %w", err)
	}
	if err := becomeRoot(root); err != nil {
		return fmt.Errorf("making the host's mounts the root: %w", err)
	}
	if plan != nil {
		if err := plan.attach(); err != nil {
			return err
		}
	}
	for _, d := range s.drop {
		if err := detachAll(d); err != nil {
			return err
		}
	}
	if len(areas) == 0 {
		return nil
	}
	// The trees' directory: a tmpfs of this namespace's own, holding the
	// command's tree mounts alone, at the paths its arguments name. Its
	// directories are made and reached through its descriptor.
	trees, err := newTmpfs("64k", "0711", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("making a tmpfs for %s: %w", s.top, err)
	}
	defer unix.Close(trees)
	if err := unix.MoveMount(trees, "", unix.AT_FDCWD, s.top, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting a tmpfs at %s: %w", s.top, err)
	}
	for i, a := range areas {
		dir, err := mkdirBeneath(trees, s.rel(a))
		if err != nil {
			return fmt.Errorf("making %s: %w", a, err)
		}
		err = unix.MoveMount(clones[i], "", dir, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(dir)
		if err != nil {
			return fmt.Errorf("attaching %s: %w", a, err)
		}
	}
	return nil
}

// rel is path (below top, as Run checked) relative to top.
func (s *Namespaces) rel(path string) string { return strings.TrimPrefix(path, s.top+"/") }

// beneath resolves within a directory descriptor only: no link, no magic
// link, nothing above it.
var beneath = &unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
}

// mkdirBeneath makes the directories of rel below dir, one component at a
// time through the descriptor of its parent, and returns the last one
// opened.
func mkdirBeneath(dir int, rel string) (int, error) {
	cur, err := unix.Openat2(dir, ".", beneath)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(cur, c, 0o711); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, err
		}
		next, err := unix.Openat2(cur, c, beneath)
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// detachAll detaches, in the calling thread's mount namespace, every
// mount at dir and below it.
func detachAll(dir string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.EINVAL) {
			// Not a mount point (or no longer): what is mounted below
			// it goes one outermost mount at a time.
			break
		}
		if err != nil {
			return fmt.Errorf("detaching the mounts at %s: %w", dir, err)
		}
		if i == 64 {
			return fmt.Errorf("detaching the mounts at %s: still mounted after 64 detaches", dir)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/mountinfo", unix.Gettid()))
	if err != nil {
		return fmt.Errorf("reading the start namespace's mounts: %w", err)
	}
	var below []string
	for _, line := range strings.Split(string(b), "\n") {
		// ID parent major:minor root mount-point ...
		if f := strings.Fields(line); len(f) > 4 {
			if p := mountinfo.Unescape(f[4]); strings.HasPrefix(p, dir+"/") {
				below = append(below, p)
			}
		}
	}
	for _, p := range outermost(below) {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detaching the mounts at %s: %w", p, err)
		}
	}
	return nil
}

// cloneMount clones the mount held by at (named what in errors) and every
// mount below it, less the unbindable ones and what is below them, as a
// detached tree with private propagation: nothing done to it reaches the
// host's mounts. It closes at.
func cloneMount(at int, what string) (int, error) {
	defer unix.Close(at)
	return cloneAt(at, what, true)
}

// becomeRoot makes the detached mount tree fd the root of the calling
// thread's mount namespace, and detaches the root it had.
func becomeRoot(fd int) error {
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, "/", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return err
	}
	if err := unix.Fchdir(fd); err != nil {
		return err
	}
	// The old root goes on top of the new one, and is detached from
	// there.
	if err := unix.PivotRoot(".", "."); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return err
	}
	return unix.Chdir("/")
}

// makeSeed makes the seed namespace: a copy of the host's, with private
// propagation, whose root is then an empty tmpfs, the host's mounts
// detached. It returns a descriptor holding it.
func makeSeed() (int, error) {
	fd := -1
	err := osthread.Disposable(func() (err error) {
		fd, err = seedHere()
		return err
	})
	return fd, err
}

func seedHere() (int, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return -1, fmt.Errorf("making the seed mount namespace: %w", err)
	}
	// Before anything is mounted: nothing done here may reach the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, fmt.Errorf("making the seed mount namespace private: %w", err)
	}
	ns, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/mnt", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the seed mount namespace: %w", err)
	}
	empty, err := emptyTmpfs()
	if err == nil {
		err = becomeRoot(empty)
		unix.Close(empty)
	}
	if err != nil {
		unix.Close(ns)
		return -1, fmt.Errorf("emptying the seed mount namespace: %w", err)
	}
	return ns, nil
}

// emptyTmpfs is a new, detached, read-only tmpfs.
func emptyTmpfs() (int, error) {
	return newTmpfs("4k", "0555", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
}

// newTmpfs is a new, detached tmpfs of size and root mode, with the mount
// attributes attrs.
func newTmpfs(size, mode string, attrs int) (int, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "size", size); err != nil {
		return -1, err
	}
	if err := unix.FsconfigSetString(fs, "mode", mode); err != nil {
		return -1, err
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, err
	}
	return unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
}
