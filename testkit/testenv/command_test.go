package testenv

import (
	"errors"
	"os/exec"
	"testing"
	"time"
)

// A command that outlives its deadline is killed with what it started: a
// child holding the output pipe does not keep the test waiting.
func TestCommandKillsItsGroupAtTheDeadline(t *testing.T) {
	cmd, cancel := Command(300*time.Millisecond, "sh", "-c", "sleep 60 & sleep 60")
	defer cancel()
	start := time.Now()
	_, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("err %v, want the killed command's exit", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("returned after %s: the group was not killed", d)
	}
}
