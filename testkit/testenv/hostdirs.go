package testenv

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SharedDir is t.TempDir made searchable and readable by every user, the
// way a host directory shared with agents is: agents run under host ids of
// their own, and the test's private temporary directory (mode 0700) would
// keep them out of fixtures they are meant to see.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatalf("making %s searchable: %v", p, err)
		}
	}
	return dir
}

// GiveTo makes id (uid and gid) the owner of each path and everything
// beneath it: a directory an agent with that id may write.
func GiveTo(t testing.TB, id uint32, paths ...string) {
	t.Helper()
	for _, root := range paths {
		if err := ChownTree(root, id, id); err != nil {
			t.Fatalf("giving %s to id %d: %v", root, id, err)
		}
	}
}

// ChownTree makes uid and gid the owners of root and everything beneath
// it, links themselves rather than what they point to. Every suite's
// helper that hands a fixture to an agent's id uses it.
func ChownTree(root string, uid, gid uint32) error {
	return filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(uid), int(gid))
	})
}

// MountsBelow counts the mounts of this process's mount namespace at or
// below dir.
func MountsBelow(t testing.TB, dir string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			n++
		}
	}
	return n
}
