// Package mountns binds the git directories of worktrees into a running
// container's mount namespace (containerd and Incus alike), and takes them
// out again.
package mountns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/mountinfo"
	"github.com/cireilclaw/sandbox-controller/internal/osthread"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Git directory binds come and go with the claims of a running container,
// and are never part of its configuration: the container runtime would
// bind them by path, and the path lies in a mount the agent writes to (see
// runtimes.GitDir). So every one is put in place after the container
// starts, and live as claims change: the directory, opened beneath its
// mount, is cloned as a detached mount (open_tree on the handle) in the
// controller's mount namespace and attached (move_mount) inside the
// container's, on a thread that has left the controller's.

// Inject mounts each git directory bind of in inside the mount
// namespace of pid, the container's init. A target that is a mount point
// already is left alone, so a retry after a failure part way does not
// stack a second mount; a directory that cannot be opened beneath its
// mount is left out, and its claim's git reports it; so is a target whose
// path inside the container holds a link (ErrLinkInPath).
func Inject(pid uint32, in runtimes.Instance, binds []runtimes.Bind) error {
	for _, b := range binds {
		mounted, err := MountedIn(pid, b.Target)
		if err != nil {
			return err
		}
		if mounted {
			continue
		}
		dir, err := in.OpenGitDir(b)
		if err != nil {
			continue
		}
		err = injectBind(pid, dir, b)
		dir.Close()
		if errors.Is(err, ErrLinkInPath) {
			// The agent put a link on the target's path: the bind is
			// left out, as one whose directory cannot be opened.
			continue
		}
		if err != nil {
			return fmt.Errorf("binding %s at %s inside the container: %w", b.Source, b.Target, err)
		}
	}
	return nil
}

func injectBind(pid uint32, dir *os.File, b runtimes.Bind) error {
	tree, err := unix.OpenTree(int(dir.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("cloning %s: %w", b.Source, err)
	}
	defer unix.Close(tree)
	// The same options as the binds of the container's spec, and private:
	// a clone of a shared host mount would be one of its peers, and what
	// is mounted or unmounted below it in the container would be on the
	// host too.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if b.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("setting mount options: %w", err)
	}
	return inMountNamespace(pid, func() error {
		// Inside the container: its root, its directories, which the
		// agent writes. The target is made and opened without following
		// a link, and the clone attached to that descriptor.
		dest, err := openTarget(b.Target, true)
		if err != nil {
			return err
		}
		defer unix.Close(dest)
		return unix.MoveMount(tree, "", dest, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
	})
}

// ErrLinkInPath reports a target whose path inside the container holds a
// symbolic link or something other than a directory: the agent put it
// there, and it is not followed.
var ErrLinkInPath = errors.New("a component is a symbolic link or not a directory (placed there from inside the sandbox?); it is not followed")

// resolveNoLinks refuses every symbolic link and any escape from the root.
const resolveNoLinks = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openTarget opens the directory target, an absolute path in the mount
// namespace the calling thread is in, one component at a time beneath its
// root, never following a link; with create, a missing component is made.
// It belongs to the controller (host root), as before: the targets lie
// outside the areas (where the worktrees' .git files point, often below
// the container's /tmp), and a directory of the agent's holding the mount
// point would let it move the mount away from the target it is unbound
// from. An O_PATH descriptor is returned.
func openTarget(target string, create bool) (int, error) {
	cur, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the container's root: %w", err)
	}
	for _, c := range strings.Split(strings.Trim(filepath.Clean(target), "/"), "/") {
		if c == "" || c == "." || c == ".." {
			unix.Close(cur)
			return -1, fmt.Errorf("target %s: component %q is not allowed", target, c)
		}
		if create {
			if err := unix.Mkdirat(cur, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(cur)
				return -1, fmt.Errorf("target %s: creating %s: %w", target, c, err)
			}
		}
		next, err := unix.Openat2(cur, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveNoLinks})
		unix.Close(cur)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return -1, fmt.Errorf("target %s: %s: %w", target, c, ErrLinkInPath)
		}
		if err != nil {
			return -1, fmt.Errorf("target %s: opening %s: %w", target, c, err)
		}
		cur = next
	}
	return cur, nil
}

// Eject unmounts each target inside the mount namespace of pid; one
// that is not mounted is already gone.
func Eject(pid uint32, binds []runtimes.Bind) error {
	for _, b := range binds {
		mounted, err := MountedIn(pid, b.Target)
		if err != nil {
			return err
		}
		if !mounted {
			continue
		}
		err = inMountNamespace(pid, func() error { return unmountTarget(b.Target) })
		if err != nil {
			return fmt.Errorf("unbinding %s inside the container: %w", b.Target, err)
		}
	}
	return nil
}

// unmountTarget detaches the mount at target, reached without following a
// link: an agent that swapped a directory on its path for a link would
// otherwise have the controller unmount whatever the link leads to (a
// mount that hides part of /proc, say). The thread's working directory is
// moved to the target's parent, opened beneath the root; the last
// component is unmounted relative to it, not followed.
func unmountTarget(target string) error {
	parent, err := openTarget(filepath.Dir(target), false)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if err := unix.Fchdir(parent); err != nil {
		return fmt.Errorf("target %s: entering its directory: %w", target, err)
	}
	return unix.Unmount(filepath.Base(target), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}

// inMountNamespace runs fn on a thread of its own that has joined the
// mount namespace of pid (and so its root and working directory), and
// that ends with fn: no thread of the controller stays in a container's
// namespace.
func inMountNamespace(pid uint32, fn func() error) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fmt.Errorf("opening the container's mount namespace: %w", err)
	}
	defer ns.Close()
	return offMainThread(ns, fn)
}

// RunInNamespace runs fn in the mount namespace ns (an open namespace
// file such as /proc/PID/ns/mnt), on a thread of its own that ends with
// fn, as for a container's: paths fn opens resolve in that namespace, and
// mounts it makes are made there. fn must do its work on the calling
// goroutine: a goroutine it starts runs in the controller's namespace.
// Anything but a mount namespace is refused before a thread joins it.
func RunInNamespace(ns *os.File, fn func() error) error {
	if err := IsMountNamespace(ns); err != nil {
		return fmt.Errorf("%s: %w", ns.Name(), err)
	}
	return offMainThread(ns, fn)
}

// IsMountNamespace checks that f is a mount namespace.
func IsMountNamespace(f *os.File) error {
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("not a namespace: %w", err)
	}
	if t != unix.CLONE_NEWNS {
		return fmt.Errorf("a namespace, but not a mount namespace (type %#x)", t)
	}
	return nil
}

// A thread that has joined a container's mount namespace is ended, not
// brought back: a goroutine that returns with its thread still locked
// takes the thread with it. Only the main thread (the thread-group
// leader) cannot end; the Go runtime parks it for good instead, and it
// would stay in the container's namespace, where /proc/self and anything
// it later starts see the agent's mounts.
//
// So the main thread never joins. Setting it back afterwards (setns to
// the controller's namespace, kept open beforehand) was the other way,
// and a weaker one: setns gives the thread the root and working directory
// of the namespace, not the ones it had; the unshare(CLONE_FS) the join
// needs cannot be undone, so the main thread would keep a filesystem
// context of its own for the life of the process; and a setns back that
// fails leaves only a crash. A helper process (a re-exec of the
// controller per bind) would isolate the work as well, at a fork and
// exec per bind and a hook in every binary's main. Keeping the work off
// the main thread needs nothing undone.

// offMainThread runs fn in the mount namespace ns on a locked thread that
// is not the main one and that ends after fn (osthread.Disposable).
func offMainThread(ns *os.File, fn func() error) error {
	return osthread.Disposable(func() error { return joinAndRun(ns, fn) })
}

// joinAndRun must be called on a locked thread that ends with its
// goroutine; it checks once more, on that thread, that it is not the main
// one, so that no scheduling can strand the main thread.
func joinAndRun(ns *os.File, fn func() error) error {
	if onMainThread() {
		return errors.New("refusing to join the container's mount namespace on the controller's main thread: it cannot end, and would stay there")
	}
	// Threads share their filesystem context (root, cwd), and a thread
	// that shares it cannot change mount namespace.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unsharing the thread's filesystem context: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("joining the container's mount namespace: %w", err)
	}
	return fn()
}

// onMainThread says whether the calling thread is the thread-group
// leader; only meaningful on a locked thread.
func onMainThread() bool { return unix.Gettid() == unix.Getpid() }

// MountedIn says whether target is a mount point in the mount namespace of
// pid, as that process sees its paths.
func MountedIn(pid uint32, target string) (bool, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return false, fmt.Errorf("reading the container's mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// ID parent major:minor root mount-point options ...
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && mountinfo.Unescape(fields[4]) == target {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("reading the container's mounts: %w", err)
	}
	return false, nil
}
