//go:build linux

package areas

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzRootPaths throws arbitrary paths at a root holding links of every
// kind. Whatever the path, a successful open must be beneath the root (as
// the kernel reports it in /proc/self/fd), a read must never return a
// marker from outside, and nothing outside the root may change.
func FuzzRootPaths(f *testing.F) {
	for _, c := range escapeCases {
		f.Add(c.path)
	}
	for _, c := range writeEscapeCases {
		f.Add(c.path)
	}
	for _, p := range []string{
		"", ".", "/", "//", "./..", "dir/esc/../agent/workspace/file0",
		"dirlink/sub/../../absdir", "reldir/../outside/secret", "procoutdir/secret",
		"siblingdir/../workspace/file0", "dir/up/x", "chain1/", "empty/../../..",
	} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		tt := buildTree(t, fuzzTempDir(t), baseTree)
		before := tt.outsideState(t)

		for _, flags := range []int{unix.O_PATH, unix.O_PATH | unix.O_NOFOLLOW, unix.O_PATH | unix.O_DIRECTORY} {
			if fd, err := tt.r.at("fuzzing", p, p, flags); err == nil {
				assertBeneath(t, tt, fd)
				unix.Close(fd)
			}
		}
		if b, err := tt.r.Read(p); err == nil {
			if s := string(b); s == outsideSecret || s == siblingSecret {
				t.Fatalf("Read(%q) returned %q from outside the root", p, s)
			}
		}
		if f, err := tt.r.Open(p); err == nil {
			assertBeneath(t, tt, int(f.Fd()))
			f.Close()
		}
		if ents, err := tt.r.List(p); err == nil {
			for _, e := range ents {
				// Only the outside directory and the sibling area hold
				// entries with these names.
				if e.Name == "secret" || e.Name == "note" {
					t.Fatalf("List(%q) listed %q from outside the root", p, e.Name)
				}
			}
		}
		_, _ = tt.r.Stat(p)
		_, _ = tt.r.Lstat(p)

		if staysInside(tt.tmp, tt.root, p) {
			_ = tt.r.Write(p, []byte("fuzz"), 0o644)
			_ = tt.r.Mkdir(p, true)
			_ = tt.r.Mkdir(p+"/fz", false)
			_ = tt.r.Remove(p, false)
		}
		tt.assertOutsideUnchanged(t, before)
	})
}

// fuzzTempDir prefers a tmpfs, where the fsyncs of Write cost nothing, so
// the fuzzer spends its time on paths rather than on the disk.
func fuzzTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "areas-fuzz-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// staysInside is an independent, deliberately simple model of path
// resolution used only as a safety net: the fuzzer runs the mutating
// operations only on paths whose every step stays inside the test's
// temporary directory, so that even a regressed implementation running as
// root could only damage the test tree, where the outside check notices.
// Missing components count as directories about to be created.
func staysInside(tmp, root, p string) bool {
	if strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 {
		return true // refused before any syscall
	}
	inside := func(q string) bool { return q == tmp || strings.HasPrefix(q, tmp+"/") }
	// Only where an original component has been fully resolved is a
	// location acted on; the steps inside a link's target are lookups. A
	// sentinel item marks the end of a link expanded for an original
	// component.
	type item struct {
		name       string
		orig, stop bool
	}
	var pending []item
	for _, c := range strings.Split(p, "/") {
		pending = append(pending, item{name: c, orig: true})
	}
	cur := root
	hops := 0
	for len(pending) > 0 {
		it := pending[0]
		pending = pending[1:]
		switch {
		case it.stop:
		case it.name == "" || it.name == ".":
		case it.name == "..":
			cur = filepath.Dir(cur)
		default:
			next := filepath.Join(cur, it.name)
			target, err := os.Readlink(next)
			switch {
			case err == nil:
				if hops++; hops > 40 {
					return false
				}
				if strings.HasPrefix(target, "/") {
					cur = "/"
				}
				var expanded []item
				for _, c := range strings.Split(target, "/") {
					expanded = append(expanded, item{name: c})
				}
				if it.orig {
					expanded = append(expanded, item{stop: true, orig: true})
				}
				pending = append(expanded, pending...)
				continue
			case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOTDIR):
				cur = next
			default:
				return false
			}
		}
		if it.orig && !inside(cur) {
			return false
		}
	}
	return true
}
