//go:build linux

package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A file longer than readFile's first buffer is read whole, and a missing
// one is fs.ErrNotExist, which Usage's callers read as "not running".
func TestReadFileReadsAllAndSaysWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("0123456789abcdef\n", 300) // 5,100 bytes
	p := filepath.Join(dir, "long")
	if err := os.WriteFile(p, []byte(long), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readFile(p)
	if err != nil || got != long {
		t.Fatalf("readFile of %d bytes: %d bytes, %v", len(long), len(got), err)
	}
	if got, err := readFile(filepath.Join(dir, "empty-dir-entry")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("readFile of a missing file: %q, %v; want fs.ErrNotExist", got, err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := readFile(empty); err != nil || got != "" {
		t.Fatalf("readFile of an empty file: %q, %v", got, err)
	}
}

// startHeld starts script in the instance's cgroup and returns once it
// printed "held"; the test's end kills it.
func startHeld(t *testing.T, m *Manager, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start("inst", cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if _, err := out.Read(make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// Usage reads what a real cgroup holds: a shell in the instance that
// holds 8 MB in a variable while a sleep runs beside it is two processes
// using at least that.
func TestUsageReadsTheInstanceCgroup(t *testing.T) {
	m := newManager(t)
	startHeld(t, m, `x=$(head -c 8000000 /dev/zero | tr '\0' a); sleep 30 & echo held; wait`)
	u, err := m.Usage("inst")
	if err != nil {
		t.Fatal(err)
	}
	if u.Pids != 2 || u.MemoryBytes < 8_000_000 {
		t.Fatalf("usage of a shell holding 8 MB beside a sleep: %+v; want 2 processes and at least 8,000,000 bytes", u)
	}
	if _, err := m.Usage("no-such-instance"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("usage of an instance without a cgroup: %v; want fs.ErrNotExist", err)
	}
}

// Usage through the files kept open reads what the cgroup holds now, not
// what it held when they were opened; a cgroup removed and made again is
// read anew, and one removed behind the manager's back is read by path
// (not running); the descriptors are close-on-exec.
func TestUsageFilesKeptOpenReadTheCgroupAsItIsNow(t *testing.T) {
	m := newManager(t)
	if u, err := m.Usage("inst"); err != nil || u.Pids != 0 {
		t.Fatalf("usage of an empty cgroup: %+v, %v", u, err)
	}
	if m.usage.count() != 1 {
		t.Fatalf("%d instances keep files open after a read, want 1", m.usage.count())
	}
	cmd := startHeld(t, m, `sleep 30 & echo held; wait`)
	if u, err := m.Usage("inst"); err != nil || u.Pids != 2 {
		t.Fatalf("usage through the kept files with a shell and a sleep inside: %+v, %v; want 2 processes", u, err)
	}
	f := m.usage.take("inst")
	f.mu.Lock()
	fds := slices.Clone(f.fds[:f.opened])
	f.mu.Unlock()
	if want := usageFilesRead(m.V2, m.swap, m.tcp); len(fds) != want {
		t.Fatalf("%d files kept open, want %d", len(fds), want)
	}
	for i, fd := range fds {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Fatalf("file %d kept open without close-on-exec (flags %#x, %v): a command started would inherit it", i, flags, err)
		}
	}

	// Removed and made again: the new cgroup's counters, not the old
	// one's, and the old descriptors closed.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := m.Remove("inst"); err != nil {
		t.Fatal(err)
	}
	for i, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			t.Fatalf("file %d still open after Remove", i)
		}
	}
	if err := m.Ensure("inst", Limits{Pids: 64}); err != nil {
		t.Fatal(err)
	}
	if u, err := m.Usage("inst"); err != nil || u.Pids != 0 || u.CPUSeconds != 0 {
		t.Fatalf("usage of the cgroup made again: %+v, %v; want a fresh one", u, err)
	}

	// Removed by someone else while its files are open: read by path,
	// which says it is gone.
	for _, d := range m.Dirs("inst") {
		if err := unix.Rmdir(d); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Usage("inst"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("usage of a cgroup removed behind the manager: %v; want fs.ErrNotExist", err)
	}
	if m.usage.count() != 0 {
		t.Fatalf("the removed cgroup's files are still kept")
	}
	if err := m.Ensure("inst", Limits{Pids: 64}); err != nil {
		t.Fatal(err)
	}
}

// No more instances keep files open than the limit; the others are read
// by path.
func TestUsageFilesKeptOpenForAtMostTheLimit(t *testing.T) {
	m := newManager(t)
	m.usage.limit = 1
	if err := m.Ensure("other", Limits{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove("other") })
	for _, name := range []string{"inst", "other"} {
		if _, err := m.Usage(name); err != nil {
			t.Fatalf("usage of %s: %v", name, err)
		}
	}
	if m.usage.count() != 1 {
		t.Fatalf("%d instances keep files open, want the limit's 1", m.usage.count())
	}
}

// BenchmarkUsage reads an instance's usage as the controller does (every
// pass of a running Sandbox and every health interval for each): through
// the files kept open, and by path with readFile and with os.ReadFile,
// the baselines of the same run.
func BenchmarkUsage(b *testing.B) {
	m := newManager(b)
	dir := func(c string) string { return m.Dir(c, "inst") }
	b.Run("kept open", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Usage("inst"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("readFile", func(b *testing.B) {
		for b.Loop() {
			if _, err := readUsage(m.V2, m.swap, m.tcp, dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("os.ReadFile", func(b *testing.B) {
		osRead := func(p string) (string, error) {
			b, err := os.ReadFile(p)
			return string(b), err
		}
		for b.Loop() {
			if _, err := readUsageWith(m.V2, m.swap, m.tcp, dir, osRead); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The kept files are matched to a usage read by position (openFiles): the
// n-th file a read opens is the n-th kept. That holds only while a read
// asks for the same files in the same order whatever they say, stopping
// at most early at a failure. A read that chose its files by their
// contents would read one file through another's descriptor.
func TestUsageReadsTheSameFilesInTheSameOrder(t *testing.T) {
	dir := func(c string) string { return filepath.Join("/cg", c, "inst") }
	// failAt answers "1" to every file but the k-th, which fails.
	failAt := func(k int) func(int) (string, error) {
		return func(i int) (string, error) {
			if i == k {
				return "", errors.New("gone")
			}
			return "1\n", nil
		}
	}
	contents := map[string]func(i int) (string, error){
		"numbers":      func(int) (string, error) { return "7\n", nil },
		"keyed lines":  func(int) (string, error) { return "usage_usec 5\noom_kill 1\nmax 2\n", nil },
		"empty":        func(int) (string, error) { return "", nil },
		"not a number": func(int) (string, error) { return "x\n", nil },
		"first fails":  failAt(0),
		"second fails": failAt(1),
		"fourth fails": failAt(3),
		"last fails":   failAt(filesPerInstance - 1),
	}
	for _, v2 := range []bool{true, false} {
		for _, swap := range []bool{true, false} {
			for _, tcp := range []bool{true, false} {
				var full []string
				for name, content := range contents {
					var paths []string
					_, _ = readUsageWith(v2, swap, tcp, dir, func(path string) (string, error) {
						paths = append(paths, path)
						return content(len(paths) - 1)
					})
					if len(paths) > filesPerInstance {
						t.Fatalf("v2=%v swap=%v tcp=%v, %s: a read opened %d files, more than the %d kept", v2, swap, tcp, name, len(paths), filesPerInstance)
					}
					if len(paths) > len(full) {
						if !slices.Equal(paths[:len(full)], full) {
							t.Fatalf("v2=%v swap=%v tcp=%v, %s: read %v, not in the order %v", v2, swap, tcp, name, paths, full)
						}
						full = paths
					} else if !slices.Equal(paths, full[:len(paths)]) {
						t.Fatalf("v2=%v swap=%v tcp=%v, %s: read %v, not in the order %v", v2, swap, tcp, name, paths, full)
					}
				}
				if want := usageFilesRead(v2, swap, tcp); len(full) != want || len(slices.Compact(slices.Sorted(slices.Values(full)))) != len(full) {
					t.Fatalf("v2=%v swap=%v tcp=%v: a whole read opened %v, want %d distinct files", v2, swap, tcp, full, want)
				}
			}
		}
	}
}

// usageFilesRead is how many files a whole usage read opens: five, and
// on v2 the swap used beside the memory where the kernel accounts it, on
// v1 the TCP buffers where they have a limit.
func usageFilesRead(v2, swap, tcp bool) int {
	if v2 && swap || !v2 && tcp {
		return 6
	}
	return 5
}

// A runtime's pid of an instance names another process once the
// instance's init has ended and the number is used again, in another
// cgroup: its usage is refused, never reported as the instance's.
func TestProcessUsageReadsOnlyACgroupOfTheInstancesName(t *testing.T) {
	m := newManager(t)
	cmd := startHeld(t, m, `sleep 30 & echo held; wait`)
	u, err := ProcessUsage("/proc", cmd.Process.Pid, nil, "inst")
	if err != nil || u.Pids != 2 {
		t.Fatalf("the usage of the instance's own process: %+v, %v; want its two processes", u, err)
	}
	_, err = ProcessUsage("/proc", cmd.Process.Pid, nil, "cireilclaw-ada", "sandbox-cireilclaw-ada")
	if err == nil || !strings.Contains(err.Error(), `in cgroup "inst", not the instance's`) {
		t.Fatalf("the usage of a process in cgroup inst read as instance cireilclaw-ada's: %v", err)
	}
}
