package mounttree

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// mountsAt counts the mounts whose mount point is dir, from this
// process's mountinfo.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

// unmountAll detaches every mount stacked at dir.
func unmountAll(t *testing.T, dir string) {
	for range 16 {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return
		}
	}
	t.Errorf("%s: still mounted after 16 detaches", dir)
}

// A fresh trees directory becomes a tmpfs of its own, once however many
// processes prepare it at the same moment: the directories of every tree's
// mount points are then made in memory, not on the disk (twenty times
// cheaper on the hosts of docs/benchmarks-scale.md), and go with a reboot.
func TestFreshTreesDirectoryIsATmpfsOfItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mounting needs root: run the tests as root (CI does)")
	}
	dir := filepath.Join(t.TempDir(), "trees")
	t.Cleanup(func() { unmountAll(t, dir) })
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = MakeTreesMount(dir) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("%s is on a file system of type %#x, not a tmpfs", dir, fs.Type)
	}
	if n := mountsAt(t, dir); n != 1 {
		t.Fatalf("%d mounts at %s, want 1: a second tmpfs hides the first one's trees", n, dir)
	}
	if err := os.Mkdir(filepath.Join(dir, "kept"), 0o711); err != nil {
		t.Fatal(err)
	}
	// A later start keeps it, and what it holds.
	if err := MakeTreesMount(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kept")); err != nil {
		t.Fatalf("preparing the trees directory again lost what it held: %v", err)
	}
	if n := mountsAt(t, dir); n != 1 {
		t.Fatalf("%d mounts at %s after a second start, want 1", n, dir)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o711 || st.Uid != 0 {
		t.Fatalf("%s has mode %o and owner %d, want 0711 and root", dir, st.Mode&0o7777, st.Uid)
	}
}

// A trees directory that already holds something and is not a mount (trees
// an earlier version left, bound where they are) keeps it: a tmpfs over it
// would hide trees still in use. It is bound on itself, as before.
func TestTreesDirectoryHoldingTreesIsNotHidden(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mounting needs root: run the tests as root (CI does)")
	}
	dir := filepath.Join(t.TempDir(), "trees")
	if err := os.MkdirAll(filepath.Join(dir, "older"), 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(t, dir) })
	if err := MakeTreesMount(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "older")); err != nil {
		t.Fatalf("what the trees directory held is gone from view: %v", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		var parent unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(dir), &parent); err != nil || parent.Type != unix.TMPFS_MAGIC {
			t.Fatalf("a tmpfs was mounted over %s, which held trees", dir)
		}
	}
	if own, err := isMountRoot(dir); err != nil || !own {
		t.Fatalf("%s is not a mount of its own (%v): trees below it would propagate", dir, err)
	}
}
