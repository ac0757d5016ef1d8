//go:build linux

package cgroup

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// swapLimited is newManager where the kernel accounts swap, which a memory
// limit must then forbid.
func swapLimited(t *testing.T) *Manager {
	t.Helper()
	m := newManager(t)
	if !m.swap {
		testenv.Missing(t, "swap accounting", "boot the kernel without swapaccount=0 or cgroup.memory=noswap")
	}
	return m
}

// swapLimit reads the instance's swap limit as the kernel holds it: on v1
// of memory and swap together, on v2 of swap alone.
func swapLimit(t *testing.T, m *Manager) string {
	t.Helper()
	file := filepath.Join(m.Dir("memory", "inst"), "memory.memsw.limit_in_bytes")
	if m.V2 {
		file = filepath.Join(m.Dir("", "inst"), "memory.swap.max")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A memory limit forbids swap beyond it, as it is set, lowered, raised
// and lifted (on v1 the kernel refuses a memory limit above the memsw one
// at every write, so the order of the two writes changes with the way
// the limit goes).
func TestMemoryLimitForbidsSwap(t *testing.T) {
	m := swapLimited(t)
	unlimited := "max"
	if !m.V2 {
		unlimited = strconv.FormatInt(1<<63-4096, 10) // -1, as v1 rounds it
	}
	for _, l := range []int64{64 << 20, 32 << 20, 256 << 20, 0, 128 << 20} {
		if err := m.Ensure("inst", Limits{Pids: 64, MemoryBytes: l}); err != nil {
			t.Fatalf("setting the memory limit to %d: %v", l, err)
		}
		want := unlimited
		switch {
		case l > 0 && m.V2:
			want = "0"
		case l > 0:
			want = strconv.FormatInt(l, 10)
		}
		if got := swapLimit(t, m); got != want {
			t.Errorf("with a memory limit of %d the swap limit is %s, want %s", l, got, want)
		}
	}
}

// A memory hog on a host with swap is killed at its memory limit, not
// swapped out, and the instance says so. Where the host has no swap on, a
// swap file is turned on for the test and off at its end.
func TestMemoryHogIsKilledAtTheLimitWithSwapOn(t *testing.T) {
	testenv.Binary(t, "python3", "install python3")
	m := swapLimited(t)
	ensureSwap(t, 256)
	if err := m.Ensure("inst", Limits{Pids: 64, MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command("python3", "-c", testenv.MemoryHog(192))
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := m.Start("inst", cmd); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if err == nil || strings.Contains(out.String(), "touched") {
		t.Fatalf("192 MiB touched under a 64 MiB limit with swap on: %v, stdout %q stderr %q", err, out.String(), stderr.String())
	}
	u, uerr := m.Usage("inst")
	if uerr != nil {
		t.Fatal(uerr)
	}
	if u.OOMKills == 0 {
		t.Fatalf("usage %+v: the OOM kill is not counted (%v)", u, err)
	}
}

// The memory an instance uses counts what it has in swap: a cgroup made
// before its memory limit forbade swap (a controller of an earlier
// version made it, and this one adopted it) may have most of its memory
// there.
func TestUsageCountsSwap(t *testing.T) {
	testenv.Binary(t, "python3", "install python3")
	m := swapLimited(t)
	ensureSwap(t, 256)
	if err := m.Ensure("inst", Limits{Pids: 64, MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	file, unlimited := filepath.Join(m.Dir("", "inst"), "memory.swap.max"), "max"
	if !m.V2 {
		file, unlimited = filepath.Join(m.Dir("memory", "inst"), "memory.memsw.limit_in_bytes"), "-1"
	}
	if err := os.WriteFile(file, []byte(unlimited), 0); err != nil {
		t.Fatal(err)
	}
	startHeld(t, m, `exec python3 -c 'import time; b = bytearray(128 << 20); b[::4096] = b"x" * len(b[::4096]); print("held", flush=True); time.sleep(60)'`)
	u, err := m.Usage("inst")
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryBytes < 128<<20 {
		t.Fatalf("usage %+v of a process holding 128 MiB under a 64 MiB limit, the rest in swap: want at least %d bytes", u, 128<<20)
	}
}

// ensureSwap turns on a swap file of mib MiB for the test when the host
// has no swap on, and turns it off and removes it at the test's end.
func ensureSwap(t *testing.T, mib int) {
	t.Helper()
	if swaps, err := os.ReadFile("/proc/swaps"); err == nil && strings.Count(string(swaps), "\n") > 1 {
		return
	}
	mkswap := testenv.Binary(t, "mkswap", "install util-linux")
	swapon := testenv.Binary(t, "swapon", "install util-linux")
	swapoff := testenv.Binary(t, "swapoff", "install util-linux")
	// A swap file needs a disk's file system: /tmp may be a tmpfs.
	dir, err := os.MkdirTemp("/var/tmp", "sandbox-controller-swap-test-")
	if err != nil {
		testenv.Missing(t, "a directory for a swap file", err.Error())
	}
	file := filepath.Join(dir, "swap")
	t.Cleanup(func() {
		if out, err := exec.Command(swapoff, file).CombinedOutput(); err != nil && !strings.Contains(string(out), "Invalid argument") {
			t.Errorf("turning the test's swap file off: %v: %s", err, out)
		}
		_ = os.RemoveAll(dir)
	})
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	// Written, not allocated: swapon refuses a file with holes or
	// unwritten extents on some file systems.
	chunk := make([]byte, 1<<20)
	for range mib {
		if _, err := f.Write(chunk); err != nil {
			_ = f.Close()
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkswap, file).CombinedOutput(); err != nil {
		t.Fatalf("mkswap: %v: %s", err, out)
	}
	if out, err := exec.Command(swapon, file).CombinedOutput(); err != nil {
		testenv.Missing(t, "a swap file the kernel takes", string(out))
	}
}
