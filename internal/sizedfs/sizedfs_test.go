package sizedfs_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/sizedfs"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func sized(t *testing.T, size int64) sizedfs.FS {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (loop devices and mounts need CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	root := t.TempDir()
	f := sizedfs.FS{Dir: filepath.Join(root, "agent", "disk"), Size: size, Anchor: root}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return f
}

func TestAWriteStopsAtTheSize(t *testing.T) {
	f := sized(t, 1<<20)
	created, err := f.Mount()
	if err != nil || !created {
		t.Fatalf("Mount = %v, %v", created, err)
	}
	err = os.WriteFile(filepath.Join(f.Dir, "big"), make([]byte, 4<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("4 MiB into 1 MiB: %v, want ENOSPC", err)
	}
	used, size, err := f.Usage()
	if err != nil || size > 1<<20 || used > size {
		t.Fatalf("Usage = %d of %d, %v", used, size, err)
	}
	if fi, err := os.Stat(f.Image()); err != nil || fi.Size() != 1<<20 {
		t.Fatalf("image: %+v, %v", fi, err)
	}
}

func TestAGrownSizeKeepsWhatItHolds(t *testing.T) {
	f := sized(t, 1<<20)
	if _, err := f.Mount(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.Dir, "kept"), []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.Size = 4 << 20
	if created, err := f.Mount(); err != nil || created {
		t.Fatalf("Mount again = %v, %v", created, err)
	}
	if b, err := os.ReadFile(filepath.Join(f.Dir, "kept")); err != nil || string(b) != "kept\n" {
		t.Fatalf("after growing: %q, %v", b, err)
	}
	if _, size, err := f.Usage(); err != nil || size <= 2<<20 {
		t.Fatalf("grown to %d bytes, %v", size, err)
	}
	if err := os.WriteFile(filepath.Join(f.Dir, "more"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatalf("2 MiB more after growing to 4 MiB: %v", err)
	}
}

// An image path that is a link is refused, never followed: the file it
// names is not made into a file system.
func TestAnImageThatIsALinkIsRefused(t *testing.T) {
	f := sized(t, 1<<20)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("host data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(f.Dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, f.Image()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mount(); err == nil {
		t.Fatal("Mount followed a link at the image's path")
	}
	if b, _ := os.ReadFile(victim); string(b) != "host data\n" {
		t.Fatalf("the link's target changed: %q", b)
	}
}

func TestRemoveTakesTheImage(t *testing.T) {
	f := sized(t, 1<<20)
	if _, err := f.Mount(); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f.Image(), f.Dir} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Remove: %v", p, err)
		}
	}
}

func TestASizeBelowTheSmallestIsRefused(t *testing.T) {
	f := sized(t, sizedfs.MinSize-1)
	if _, err := f.Mount(); err == nil {
		t.Fatal("a file system below the smallest size was made")
	}
}

// loopsBacking counts the loop devices whose file is image.
func loopsBacking(t *testing.T, image string) int {
	t.Helper()
	n := 0
	entries, _ := os.ReadDir("/sys/block")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err == nil && strings.TrimSpace(string(b)) == image {
			n++
		}
	}
	return n
}

// A file system still held elsewhere when it is unmounted (a mount tree's
// clone of an overlay on it) lives on with changes the image does not
// have yet. The next Mount gives that live file system, never a second
// one read from the image: with two, the changes made just before the
// stop were missing after the start.
func TestMountAfterALazyUnmountGivesTheLiveFileSystem(t *testing.T) {
	f := sized(t, 1<<20)
	if _, err := f.Mount(); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "held")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(f.Dir, elsewhere, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Unmount(elsewhere, syscall.MNT_DETACH) }()
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(f.Dir, "file-"+strconv.Itoa(i)), []byte("just written\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Unmount(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mount(); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if b, err := os.ReadFile(filepath.Join(f.Dir, "file-"+strconv.Itoa(i))); err != nil || string(b) != "just written\n" {
			t.Fatalf("file-%d after the unmount and mount: %q, %v", i, b, err)
		}
	}
	if n := loopsBacking(t, f.Image()); n != 1 {
		t.Fatalf("%d loop devices back the image; one file system must have one", n)
	}
}

// A layer with thousands of long-named files that do not fit makes cp
// print a line for each; the error keeps only the start of it, however
// many files the agent made.
func TestCopyIntoKeepsLittleOfCpsOutput(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (mounts need CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	from, into := t.TempDir(), filepath.Join(t.TempDir(), "small")
	if err := testenv.MountAt(t, into, "tmpfs", "tmpfs", 0, "size=16m,nr_inodes=16"); err != nil {
		testenv.Missing(t, "a tmpfs the test can mount", err.Error())
	}
	const files = 3000
	name := strings.Repeat("n", 200)
	for i := range files {
		if err := os.WriteFile(filepath.Join(from, name+strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := sizedfs.CopyInto(from, into)
	if err == nil {
		t.Fatalf("%d files copied into a file system of 16 inodes", files)
	}
	if msg := err.Error(); len(msg) > 8<<10 || !strings.Contains(msg, "more bytes dropped") {
		t.Fatalf("the error of a copy failing for %d files is %d bytes (want at most 8 KiB, saying what was dropped): %.300s", files, len(msg), msg)
	}
}

// TestUnmountNeverFollowsALinkToAnotherMount puts a link where the agent's
// directory was, leading to another sized file system (the host's ext4
// mount, as far as the agent knows). Unmount, Usage and Remove, run as root,
// must leave it mounted and never measure it.
func TestUnmountNeverFollowsALinkToAnotherMount(t *testing.T) {
	host := sized(t, 1<<20)
	if _, err := host.Mount(); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	agent := sizedfs.FS{Dir: filepath.Join(root, "alice", "disk"), Size: 1 << 20, Anchor: root}
	if err := os.Symlink(filepath.Dir(host.Dir), filepath.Join(root, "alice")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := agent.Usage(); err == nil {
		t.Errorf("the host's file system was measured through a link")
	}
	_ = agent.Unmount()
	_ = agent.Remove()
	if ok, err := host.Mounted(); err != nil || !ok {
		t.Fatalf("the host's file system is gone after the agent's unmount through a link (mounted %v, %v)", ok, err)
	}
}
