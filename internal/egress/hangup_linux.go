package egress

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// hungUp reports whether the client on c ends its side of the connection
// (or resets it) before done is closed, without reading what it sent: the
// socket is polled for POLLRDHUP, which unread bytes do not hide. A
// connection that is not a socket is never told gone.
func hungUp(c net.Conn, done <-chan struct{}) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	tick := time.NewTicker(hangupPoll)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return false
		case <-tick.C:
		}
		gone := false
		if err := rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
				gone = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
			}
		}); err != nil {
			return false
		}
		if gone {
			return true
		}
	}
}
