package bwrap

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/procstat"
)

// A command's sandbox has two bubblewrap processes: the one this process
// starts, and its child, the init of the sandbox's pid namespace, which
// calls setsid (--new-session) and so leaves the first one's process
// group. Killing the group kills only the first; the init should follow
// through its parent-death signal, but bubblewrap sets that only after the
// clone, and an init whose parent was killed before then lives on with
// the command, past any cancel or exec timeout. So the driver learns the
// init's pid from bubblewrap (--info-fd, written right after the clone)
// and kills the init too: with it goes everything in its pid namespace.

// initWait bounds how long a kill waits for bubblewrap to tell its init:
// it does within milliseconds of its start, or closes the pipe on its way
// out. Generous, for a machine so loaded that a start takes seconds: a
// kill that gave up would leave the init running.
const initWait = 10 * time.Second

// sandboxInit learns and kills one command's sandbox init.
type sandboxInit struct {
	r    *os.File
	done chan struct{}

	mu    sync.Mutex
	pidfd int // the init, once known and checked; -1 before and after
}

// newSandboxInit makes the pipe bubblewrap reports on; w is its end for
// the command (--info-fd), closed by the caller once the command started.
func newSandboxInit() (*sandboxInit, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	return &sandboxInit{r: r, done: make(chan struct{}), pidfd: -1}, w, nil
}

// watch reads bubblewrap's report once it runs as process outer and
// holds a descriptor of the init it names: only a child of outer, so that
// a pid the kernel gave again is never taken for it.
func (s *sandboxInit) watch(outer int) {
	go func() {
		defer close(s.done)
		defer s.r.Close()
		b, err := io.ReadAll(io.LimitReader(s.r, 64<<10))
		if err != nil {
			return
		}
		var info struct {
			ChildPid int `json:"child-pid"`
		}
		if json.Unmarshal(b, &info) != nil || info.ChildPid <= 0 {
			return
		}
		fd, err := unix.PidfdOpen(info.ChildPid, 0)
		if err != nil {
			return
		}
		// Opened first, checked after: if the process at that pid now is
		// outer's child, it is the init the descriptor holds.
		if st, err := procstat.Read(info.ChildPid); err != nil || st.PPid != outer {
			unix.Close(fd)
			return
		}
		s.mu.Lock()
		s.pidfd = fd
		s.mu.Unlock()
	}()
}

// abandon is watch for a command that did not start.
func (s *sandboxInit) abandon() {
	s.r.Close()
	close(s.done)
}

// kill kills the init, waiting up to wait for bubblewrap's report while
// process outer, which makes it, runs.
func (s *sandboxInit) kill(outer int, wait time.Duration) {
	if wait > 0 {
		s.await(outer, wait)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidfd >= 0 {
		_ = unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	}
}

// await waits up to wait for bubblewrap's report, and no longer than
// process outer lives: a start that failed (the starter could not become
// bubblewrap) reports nothing, and its process is gone.
func (s *sandboxInit) await(outer int, wait time.Duration) {
	fd, err := unix.PidfdOpen(outer, 0)
	if err != nil {
		return // gone and reaped
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		// A pidfd polls readable once its process has exited. What it
		// wrote before is read within moments; a failed start wrote
		// nothing, and waits those moments only.
		if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0); n > 0 {
			t := time.NewTimer(100 * time.Millisecond)
			defer t.Stop()
			select {
			case <-s.done:
			case <-t.C:
			}
			return
		}
	}
}

// close lets the init's descriptor go, once the command was waited for.
func (s *sandboxInit) close() {
	// Its reader waits no longer: bubblewrap has written, or never will.
	s.r.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidfd >= 0 {
		unix.Close(s.pidfd)
		s.pidfd = -1
	}
}

// command is a running command as the driver tracks it.
type command struct {
	cmd *exec.Cmd
	// init is the sandbox's init; nil without the sandbox.
	init *sandboxInit
}

// kill kills the command and everything it started: the sandbox's init
// (waiting up to wait for bubblewrap to name it), then the process group.
func (c *command) kill(wait time.Duration) error {
	if c.init != nil {
		c.init.kill(c.cmd.Process.Pid, wait)
	}
	return syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
}
