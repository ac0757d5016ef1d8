package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// MountAt makes dir (and its parents, mode 0755) and mounts source there
// (mount(2)'s arguments), taken away when the test ends; it returns the
// mount's error, for the test to fail or call its runtime missing.
func MountAt(t testing.TB, dir, source, fstype string, flags uintptr, data string) error {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(source, dir, fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", source, dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return nil
}

// Crowd mounts n small tmpfs in dir (made here), standing for a busy
// host's other mounts, takes them away when the test ends, and returns
// dir.
func Crowd(t testing.TB, dir string, n int) string {
	t.Helper()
	for i := range n {
		if err := MountAt(t, filepath.Join(dir, strconv.Itoa(i)), "tmpfs", "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TellingBwrap writes in dir (searchable by every user) a bubblewrap that
// writes the mount table it starts with to dir/table before it runs the
// real one, and returns the two paths. It runs as the agent, so the table
// is a file every user may write.
func TellingBwrap(t testing.TB, dir string) (bwrap, table string) {
	t.Helper()
	real := Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	table = filepath.Join(dir, "table")
	if err := os.WriteFile(table, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(table, 0o666); err != nil {
		t.Fatal(err)
	}
	bwrap = filepath.Join(dir, "bwrap")
	script := "#!/bin/sh\ncat /proc/self/mountinfo > " + table + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(bwrap, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bwrap, table
}
