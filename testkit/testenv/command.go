package testenv

import (
	"context"
	"os/exec"
	"syscall"
	"time"
)

// Command is name with args for a test to run within timeout, in a process
// group of its own: when timeout passes the whole group is killed (make,
// kubectl plugins, scripts and what they started), and waiting stops 5
// seconds later even if a child left behind still holds the output pipes.
// cancel releases the deadline; call it once the command is done.
func Command(timeout time.Duration, name string, args ...string) (cmd *exec.Cmd, cancel context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	cmd = exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd, cancel
}
