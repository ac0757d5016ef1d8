package containerd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/runtimes/mountns"
)

// DaemonMountNamespace as Config.MountNamespace: the mount namespace of
// the process that answers the containerd socket, found by the socket's
// peer credentials each time trees are built or removed (containerd may
// have restarted). A controller in a pod needs the node's pids (hostPID)
// to see that process.
const DaemonMountNamespace = "daemon"

// inTreesNamespace runs fn where runc resolves the trees' paths: in
// Config.MountNamespace when set, else here.
func (r *Runtime) inTreesNamespace(fn func() error) error {
	switch r.cfg.MountNamespace {
	case "":
		return fn()
	case DaemonMountNamespace:
		ns, err := daemonNamespace(r.cfg.ProcDir, r.cfg.Address)
		if err != nil {
			return fmt.Errorf("finding containerd's mount namespace: %w", err)
		}
		defer ns.Close()
		return mountns.RunInNamespace(ns, fn)
	}
	return mountns.RunInNamespace(r.treesNS, fn)
}

// daemonNamespace opens the mount namespace of the process answering the
// unix socket at address, found by the socket's peer credentials. The
// connection stays open until the namespace is, and is then checked: the
// daemon holds the other end, so a connection it has not hung up means it
// has not exited, and its pid cannot have gone to another process (an
// agent's container, say) between reading it and opening its namespace.
func daemonNamespace(procDir, address string) (*os.File, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.Dial("unix", strings.TrimPrefix(address, "unix://"))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	pid, err := peerPid(raw, address)
	if err != nil {
		return nil, err
	}
	ns, err := os.Open(filepath.Join(procDir, strconv.Itoa(int(pid)), "ns", "mnt"))
	if err != nil {
		return nil, fmt.Errorf("the mount namespace of %s's process %d: %w", address, pid, err)
	}
	if err := stillConnected(raw); err != nil {
		ns.Close()
		return nil, fmt.Errorf("the process answering %s (pid %d) went away while its mount namespace was opened: %w", address, pid, err)
	}
	return ns, nil
}

// peerPid is the pid of the process at the other end of a connected unix
// socket, as this process's pid namespace numbers it.
func peerPid(raw syscall.RawConn, address string) (int32, error) {
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("reading the peer credentials of %s: %w", address, credErr)
	}
	if cred.Pid <= 0 {
		return 0, fmt.Errorf("the process answering %s is not in this pid namespace (a controller in a pod needs hostPID)", address)
	}
	return cred.Pid, nil
}

// stillConnected reports an error when the other end of a connection has
// hung up, without waiting.
func stillConnected(raw syscall.RawConn) error {
	var revents int16
	var pollErr error
	if err := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		_, pollErr = unix.Poll(fds, 0)
		revents = fds[0].Revents
	}); err != nil {
		return err
	}
	if pollErr != nil {
		return pollErr
	}
	if revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
		return errors.New("it hung up")
	}
	return nil
}
