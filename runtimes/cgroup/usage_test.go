//go:build linux

package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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

// Usage reads what a real cgroup holds: a shell in the instance that
// holds 8 MB in a variable while a sleep runs beside it is two processes
// using at least that.
func TestUsageReadsTheInstanceCgroup(t *testing.T) {
	m := newManager(t)
	cmd := exec.Command("sh", "-c", `x=$(head -c 8000000 /dev/zero | tr '\0' a); sleep 30 & echo held; wait`)
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

// BenchmarkUsage reads an instance's usage as the controller does (every
// pass of a running Sandbox and every health interval for each), beside
// the same files read with os.ReadFile, the baseline of the same run.
func BenchmarkUsage(b *testing.B) {
	m := newManager(b)
	b.Run("readFile", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Usage("inst"); err != nil {
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
			if _, err := readUsageWith(m.V2, func(c string) string { return m.Dir(c, "inst") }, osRead); err != nil {
				b.Fatal(err)
			}
		}
	})
}
