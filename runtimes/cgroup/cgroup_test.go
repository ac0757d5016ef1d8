//go:build linux

package cgroup

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func newManager(t testing.TB) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "run the tests as root: instance cgroups are made by root")
	}
	m, err := New("sandbox-controller-cgroup-test-"+strconv.Itoa(os.Getpid()), "")
	if err != nil {
		testenv.Missing(t, "a cgroup the controller can make", err.Error())
	}
	if err := m.Ensure("inst", Limits{Pids: 64, MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Remove("inst"); err != nil {
			t.Errorf("removing the instance cgroup: %v", err)
		}
	})
	return m
}

// procsFiles are the cgroup.procs files of the instance: one per v1
// hierarchy, or the one v2 file.
func procsFiles(m *Manager) []string {
	var out []string
	for c := range m.dirs {
		out = append(out, filepath.Join(m.Dir(c, "inst"), "cgroup.procs"))
	}
	return out
}

func TestStartedCommandIsInTheInstanceCgroupFromItsStart(t *testing.T) {
	m := newManager(t)
	startsInside(t, m, func(cmd *exec.Cmd) error { return m.Start("inst", cmd) })
}

// startsInside checks that a command start starts reads the instance's
// cgroups as its first act.
func startsInside(t *testing.T, m *Manager, start func(*exec.Cmd) error) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command("cat", "/proc/self/cgroup")
	cmd.Stdout = &out
	if err := start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	for c, dir := range m.dirs {
		want := strings.TrimPrefix(filepath.Join(dir, "inst"), filepath.Join(Mount, c))
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("the command's first read of its cgroups does not name %s:\n%s", want, out.String())
		}
	}
}

// The controller never joins an instance's cgroup, not even for the
// moment of a fork: there it would be charged to the instance's memory,
// be a candidate of the instance's OOM killer, and be killed with the
// instance's processes when the instance goes.
func TestControllerNeverJoinsTheInstanceCgroup(t *testing.T) {
	neverListed(t, newManager(t), 300)
}

// neverListed starts `true` starts times while watching the instance's
// cgroup.procs files for this process.
func neverListed(t *testing.T, m *Manager, starts int) {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	files := procsFiles(m)
	ctx, stop := context.WithCancel(context.Background())
	var seen atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for _, f := range files {
				b, _ := os.ReadFile(f)
				for _, p := range strings.Fields(string(b)) {
					if p == self {
						seen.Add(1)
					}
				}
			}
		}
	}()
	for range starts {
		cmd := exec.Command("true")
		if err := m.Start("inst", cmd); err != nil {
			stop()
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			stop()
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()
	if n := seen.Load(); n > 0 {
		t.Fatalf("this process was listed in the instance's cgroup %d time(s) over %d starts", n, starts)
	}
}

// A command killed before it runs its first instruction is reported, and
// a command that cannot be started is an error, with no process left.
func TestStartOfAMissingCommandFails(t *testing.T) {
	m := newManager(t)
	cmd := exec.Command(filepath.Join(t.TempDir(), "absent"))
	if err := m.Start("inst", cmd); err == nil {
		_ = cmd.Wait()
		t.Fatal("a missing command started")
	}
	for _, f := range procsFiles(m) {
		if b, _ := os.ReadFile(f); len(bytes.TrimSpace(b)) > 0 {
			t.Errorf("%s lists %q after a start that failed", f, b)
		}
	}
}

// newJoiningManager is newManager starting commands by joining. On
// cgroup v2, which clones straight into the cgroup, JoinToStart changes
// nothing, and the same tests hold.
func newJoiningManager(t *testing.T) *Manager {
	t.Helper()
	m := newManager(t)
	m.JoinToStart = true
	return m
}

// threadsCgroups reads the cgroups of every thread of this process.
func threadsCgroups(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "cgroup"))
		if err != nil {
			continue // the thread ended meanwhile
		}
		out[task.Name()] = string(b)
	}
	return out
}

// A joining start puts the command in the instance's cgroups from its
// first instruction, as the ptrace start does.
func TestJoinedStartPutsTheCommandInFromItsStart(t *testing.T) {
	m := newJoiningManager(t)
	startsInside(t, m, func(cmd *exec.Cmd) error {
		return StartOnOwnThread(func() error { return m.Start("inst", cmd) })
	})
}

// The thread that joined for a start leaves again: after many starts no
// thread of this process is in the instance's cgroups, and the process
// is not listed there once the starts are done.
func TestJoinedStartLeavesNoThreadInside(t *testing.T) {
	m := newJoiningManager(t)
	before := threadsCgroups(t)
	var own string
	for _, cg := range before {
		own = cg
		break
	}
	for range 100 {
		cmd := exec.Command("true")
		if err := StartOnOwnThread(func() error { return m.Start("inst", cmd) }); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	for tid, cg := range threadsCgroups(t) {
		if cg != own {
			t.Errorf("thread %s is in\n%s\nafter the starts, not in this process's own\n%s", tid, cg, own)
		}
	}
	self := strconv.Itoa(os.Getpid())
	for _, f := range procsFiles(m) {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			if p == self {
				t.Errorf("%s lists this process after the starts", f)
			}
		}
	}
}

// A joining start forks inside the instance's cgroups, so the pids limit
// holds for the start itself, and says so. On v1 the joining thread counts
// for that moment: with a limit of 2, one command runs and a second is
// refused (on v2, with a limit of 1).
func TestJoinedStartAtThePidsLimitSaysSo(t *testing.T) {
	m := newJoiningManager(t)
	limit := int64(2)
	if m.V2 {
		limit = 1
	}
	if err := m.Ensure("inst", Limits{Pids: limit, MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	first := exec.Command("sleep", "30")
	if err := StartOnOwnThread(func() error { return m.Start("inst", first) }); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Process.Kill(); _ = first.Wait() }()
	second := exec.Command("true")
	err := StartOnOwnThread(func() error { return m.Start("inst", second) })
	if err == nil {
		_ = second.Wait()
		t.Fatalf("a second command started in an instance whose pids limit is %d, with one running", limit)
	}
	if !strings.Contains(err.Error(), "pids limit") {
		t.Errorf("the refusal does not name the pids limit: %v", err)
	}
}

// The cgroups of a gone state directory are removed where nothing runs,
// and never a cgroup that still holds a process, whose process lives on.
func TestRemoveUnusedKeepsWhatRuns(t *testing.T) {
	name := "sandbox-controller-cgroup-test-unused-" + strconv.Itoa(os.Getpid())
	m, err := New(name, "")
	if err != nil {
		testenv.Missing(t, "a cgroup the controller can make", err.Error())
	}
	for _, inst := range []string{"idle", "busy"} {
		if err := m.Ensure(inst, Limits{Pids: 64}); err != nil {
			t.Fatal(err)
		}
	}
	busy := exec.Command("sleep", "30")
	if err := m.Start("busy", busy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove("busy"); _ = m.RemoveAll() })
	if err := RemoveUnused(name); err != nil {
		t.Fatal(err)
	}
	for c := range m.dirs {
		if _, err := os.Stat(m.Dir(c, "idle")); !os.IsNotExist(err) {
			t.Errorf("the idle instance's %s cgroup is still there: %v", c, err)
		}
		if _, err := os.Stat(m.Dir(c, "busy")); err != nil {
			t.Errorf("the busy instance's %s cgroup was removed: %v", c, err)
		}
	}
	if err := busy.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the busy instance's process is gone: %v", err)
	}
	_ = busy.Process.Kill()
	_ = busy.Wait()
	// The kernel lets an emptied cgroup go a moment after its last
	// process: a loaded machine needs a few tries.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := RemoveUnused(name); err != nil {
			t.Fatal(err)
		}
		gone := true
		for _, dir := range m.dirs {
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				gone = false
			}
		}
		if gone {
			break
		}
	}
	for _, dir := range m.dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s is still there once nothing runs in it: %v", dir, err)
		}
	}
}
