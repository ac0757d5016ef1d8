package egress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Namespace is a network namespace with loopback alone: no route leaves
// it. It outlives every process in it (a bind mount of its nsfs file at
// Path holds it) until Remove. A Sandbox with an allowlist runs its
// commands in one, and its proxy listens inside it, served from the host.
type Namespace struct {
	Path string
}

// NewNamespace makes a namespace held at path (a new file) and opens a
// TCP listener on its loopback at 127.0.0.1:port (0: any), which the
// caller serves from the host side: the listener's socket belongs to the
// namespace, the goroutines serving it do not.
func NewNamespace(path string, port int) (*Namespace, net.Listener, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, nil, fmt.Errorf("the namespace's file: %w", err)
	}
	_ = f.Close()
	type made struct {
		l   net.Listener
		err error
	}
	ch := make(chan made, 1)
	go func() {
		// The thread enters a namespace of its own and never leaves it:
		// it ends with this goroutine, which never unlocks it.
		runtime.LockOSThread()
		l, err := enterNew(path, port)
		ch <- made{l, err}
	}()
	m := <-ch
	if m.err != nil {
		_ = os.Remove(path)
		return nil, nil, m.err
	}
	return &Namespace{Path: path}, m.l, nil
}

// enterNew moves the calling thread into a new network namespace, holds
// it at path, brings its loopback up and listens there.
func enterNew(path string, port int) (net.Listener, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("making a network namespace: %w", err)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("holding the network namespace at %s: %w", path, err)
	}
	if err := loopbackUp(); err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		return nil, err
	}
	l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		return nil, fmt.Errorf("listening in the network namespace: %w", err)
	}
	return l, nil
}

// loopbackUp sets lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing loopback up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading loopback's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing loopback up: %w", err)
	}
	return nil
}

// Run calls fn on a thread inside the namespace; the thread is thrown
// away after.
func (n *Namespace) Run(fn func() error) error {
	fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", n.Path, err)
	}
	defer unix.Close(fd)
	return inNamespace(fd, fn)
}

// inNamespace calls fn on a thread inside the network namespace fd
// refers to; the thread is thrown away after.
func inNamespace(fd int, fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- fmt.Errorf("entering the network namespace: %w", err)
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// Do calls fn with the calling goroutine's thread inside the namespace,
// and puts the thread back into the network namespace it came from after:
// a process fn starts is born inside, and its parent thread lives on (a
// child that asked to die with its parent, as bwrap does, dies with the
// thread that forked it). A thread that cannot go back is thrown away.
func (n *Namespace) Do(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("opening network namespace %s: %w", n.Path, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("entering network namespace %s: %w", n.Path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Left locked: the thread ends with this goroutine.
			ch <- errors.Join(ferr, fmt.Errorf("leaving network namespace %s: %w", n.Path, err))
			return
		}
		runtime.UnlockOSThread()
		ch <- ferr
	}()
	return <-ch
}

// Enter moves the calling thread, which its caller has locked and never
// unlocks, into the namespace for good.
func (n *Namespace) Enter() error {
	target, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", n.Path, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", n.Path, err)
	}
	return nil
}

// Remove lets the namespace go once no process is in it, and removes its
// file.
func (n *Namespace) Remove() error {
	err := unix.Unmount(n.Path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("releasing network namespace %s: %w", n.Path, err)
	}
	if err := os.Remove(n.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
