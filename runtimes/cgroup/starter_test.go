//go:build linux

package cgroup

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// newStartingManager is newManager starting v1 commands through the
// starter. On cgroup v2 commands are cloned straight into their cgroup
// and the starter is never used: the same tests then hold for that start.
func newStartingManager(t *testing.T) *Manager {
	t.Helper()
	m := newManager(t)
	m.Starter = testenv.Starter(t)
	return m
}

func TestStarterPutsTheCommandInFromItsStart(t *testing.T) {
	m := newStartingManager(t)
	startsInside(t, m, func(cmd *exec.Cmd) error { return m.Start("inst", cmd) })
}

// The starter moves itself: this process is never listed in the
// instance's cgroups.
func TestStarterLeavesTheControllerOutside(t *testing.T) {
	neverListed(t, newStartingManager(t), 100)
}

// The command runs with the ids asked for and no supplementary group,
// keeps the descriptors it was given at their numbers, and inherits none
// of the starter's: its pipe and the tasks files (which, opened by root,
// would let a holder move any process into the instance's cgroups).
func TestStarterGivesTheCommandItsIdsAndOnlyItsDescriptors(t *testing.T) {
	m := newStartingManager(t)
	given, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	cmd := exec.Command("sleep", "30")
	cmd.ExtraFiles = []*os.File{given}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 61234, Gid: 61235, Groups: []uint32{}}}
	if err := m.Start("inst", cmd); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if cmd.Path != "/usr/bin/sleep" && filepath.Base(cmd.Path) != "sleep" {
		t.Errorf("after the start the command's path is %s, not sleep's", cmd.Path)
	}
	proc := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid))
	status, err := os.ReadFile(filepath.Join(proc, "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Uid:\t61234\t61234\t61234\t61234\n", "Gid:\t61235\t61235\t61235\t61235\n"} {
		if !bytes.Contains(status, []byte(want)) {
			t.Errorf("the command's status lacks %q:\n%s", want, status)
		}
	}
	for _, line := range strings.Split(string(status), "\n") {
		if g, ok := strings.CutPrefix(line, "Groups:"); ok && strings.TrimSpace(g) != "" {
			t.Errorf("the command has supplementary groups %s, want none", g)
		}
	}
	if cmdline, _ := os.ReadFile(filepath.Join(proc, "cmdline")); string(cmdline) != "sleep\x0030\x00" {
		t.Errorf("the command's arguments are %q, want sleep 30", cmdline)
	}
	want := append([]string{"0", "1", "2", "3"}, inheritable(t)...)
	slices.Sort(want)
	// Start returns once the starter's error pipe has closed on its exec;
	// for a moment after, /proc may still list the descriptor the exec
	// closed (its link already unreadable). A descriptor the command
	// really holds stays: the listing is taken again until it matches, for
	// a second at most.
	var open []string
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		fds, err := os.ReadDir(filepath.Join(proc, "fd"))
		if err != nil {
			t.Fatal(err)
		}
		open = open[:0]
		for _, fd := range fds {
			open = append(open, fd.Name())
		}
		slices.Sort(open)
		if slices.Equal(open, want) || time.Now().After(deadline) {
			break
		}
	}
	if !slices.Equal(open, want) {
		t.Errorf("the command holds descriptors %v, want %v (0 to 3 and what this process leaves open to every child)", open, want)
	}
	if target, _ := os.Readlink(filepath.Join(proc, "fd", "3")); target != os.DevNull {
		t.Errorf("descriptor 3 is %s, want the file given (%s)", target, os.DevNull)
	}
	cgroups, _ := os.ReadFile(filepath.Join(proc, "cgroup"))
	for c, dir := range m.dirs {
		want := strings.TrimPrefix(filepath.Join(dir, "inst"), filepath.Join(Mount, c))
		if !strings.Contains(string(cgroups), want+"\n") {
			t.Errorf("the command's cgroups do not name %s:\n%s", want, cgroups)
		}
	}
}

// What the starter could not do is Start's error, and nothing is left
// running in the instance.
func TestStarterFailureIsTheStartsError(t *testing.T) {
	m := newStartingManager(t)
	missing := filepath.Join(t.TempDir(), "absent")
	cmd := exec.Command(missing)
	// exec.Command remembers the failed lookup; the starter is the one
	// to find it missing here.
	cmd.Err = nil
	err := m.Start("inst", cmd)
	if err == nil {
		_ = cmd.Wait()
		t.Fatal("a missing command started")
	}
	if !strings.Contains(err.Error(), "exec "+missing) {
		t.Errorf("the error does not say the exec of %s failed: %v", missing, err)
	}
	for _, f := range procsFiles(m) {
		if b, _ := os.ReadFile(f); len(bytes.TrimSpace(b)) > 0 {
			t.Errorf("%s lists %q after a start that failed", f, b)
		}
	}
}

// The starter runs as root: one that another user could have changed is
// refused, and none beside the executable is no starter, not an error.
func TestStarterBesideIsCheckedBeforeUse(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "sandbox-controller")
	if p, err := StarterBeside(exe); p != "" || err != nil {
		t.Fatalf("no starter beside: got %q, %v; want none and no error", p, err)
	}
	p := filepath.Join(dir, StarterName)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := StarterBeside(exe); got != p || err != nil {
		t.Fatalf("a starter only its owner writes: got %q, %v; want %s", got, err, p)
	}
	if err := os.Chmod(p, 0o775); err != nil {
		t.Fatal(err)
	}
	if _, err := StarterBeside(exe); err == nil || !strings.Contains(err.Error(), "written by its group or others") {
		t.Errorf("a group-writable starter: %v; want a refusal that says so", err)
	}
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(p, 4321, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := StarterBeside(exe); err == nil || !strings.Contains(err.Error(), "belongs to uid 4321") {
			t.Errorf("a starter of another user: %v; want a refusal that names its owner", err)
		}
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/true", p); err != nil {
		t.Fatal(err)
	}
	if _, err := StarterBeside(exe); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a starter that is a link: %v; want a refusal", err)
	}
}

// inheritable are the descriptors above 3 this process holds without
// close-on-exec (handed down by whatever started the test): every child
// inherits them, whoever starts it.
func inheritable(t *testing.T) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 3 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			out = append(out, e.Name())
		}
	}
	return out
}
