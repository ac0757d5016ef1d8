//go:build linux

package areas

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// realPathOf is where the kernel says a held handle is.
func realPathOf(t testing.TB, f *os.File) string {
	t.Helper()
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// hostDirTree is a class root with an allowed project, links of every
// kind below it, and a directory outside it.
func hostDirTree(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root + "/proj/sub", outside + "/sub"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"inside":     "proj",
		"abs-inside": root + "/proj",
		"out-abs":    outside,
		"out-rel":    "../outside",
		"magic":      "/proc/self/root" + outside,
		"magic-rel":  "../../../../../../../../../../proc/self/root" + outside,
		"proc":       "/proc",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside
}

func TestHostDirResolvesBeneathItsAnchorOnly(t *testing.T) {
	root, outside := hostDirTree(t)
	for _, tc := range []struct {
		name    string
		dir     HostDir
		want    string // the real path reached, or "" for a refusal
		wantErr error
	}{
		{"the anchor itself", HostDir{Anchor: root, Path: root}, root, nil},
		{"a directory below", HostDir{Anchor: root, Path: root + "/proj/sub"}, root + "/proj/sub", nil},
		{"a link staying below", HostDir{Anchor: root, Path: root + "/inside/sub"}, root + "/proj/sub", nil},
		{"an absolute link, even to inside", HostDir{Anchor: root, Path: root + "/abs-inside"}, "", ErrEscape},
		{"an absolute link out", HostDir{Anchor: root, Path: root + "/out-abs/sub"}, "", ErrEscape},
		{"a relative link out", HostDir{Anchor: root, Path: root + "/out-rel/sub"}, "", ErrEscape},
		{"a magic link through /proc", HostDir{Anchor: root, Path: root + "/magic"}, "", ErrEscape},
		{"a path outside the anchor", HostDir{Anchor: root, Path: outside}, "", ErrOutsideAnchor},
		{"a link where none is followed", HostDir{Anchor: root, Path: root + "/inside", NoLinks: true}, "", unix.ELOOP},
		// Beneath "/" a link means what it means to the host, but never a
		// magic link: /proc/<pid>/root jumps into another process's root.
		{"an absolute link beneath /", HostDir{Path: root + "/out-abs/sub"}, outside + "/sub", nil},
		{"a magic link beneath /", HostDir{Path: root + "/magic"}, "", unix.ELOOP},
		{"a relative way to a magic link beneath /", HostDir{Path: root + "/magic-rel"}, "", unix.ELOOP},
		{"/proc/self/root written out", HostDir{Path: "/proc/self/root" + outside}, "", unix.ELOOP},
		{"/proc itself", HostDir{Path: "/proc"}, "", ErrPseudoFS},
		{"a link to /proc", HostDir{Path: root + "/proc"}, "", ErrPseudoFS},
		{"/sys", HostDir{Path: "/sys/kernel"}, "", ErrPseudoFS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := tc.dir.Open()
			if tc.want == "" {
				if err == nil {
					got := realPathOf(t, f)
					f.Close()
					t.Fatalf("opened %s, want a refusal (%v)", got, tc.wantErr)
				}
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.dir.Path) {
					t.Fatalf("error %q does not name %s", err, tc.dir.Path)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if got := realPathOf(t, f); got != tc.want {
				t.Fatalf("reached %s, want %s", got, tc.want)
			}
		})
	}
}

// Whatever tree of directories, links (relative, absolute, magic) and
// mount points an agent builds below an anchor, a HostDir beneath it either
// is refused or reaches a directory below the anchor.
func FuzzHostDirStaysBeneathItsAnchor(f *testing.F) {
	f.Add([]byte("d a\nl b a\nl c ../..\np b/x"))
	f.Add([]byte("l a /proc/self/root\np a/etc"))
	f.Add([]byte("d a\nl a/b ../../..\np a/b"))
	f.Add([]byte("l a /\np a/tmp"))
	f.Add([]byte("d a\nd a/b\nl c a/b/../..\np c"))
	f.Add([]byte("m a\nl a/up ../..\np a/up"))
	f.Fuzz(func(t *testing.T, script []byte) {
		base := t.TempDir()
		anchor := filepath.Join(base, "anchor")
		if err := os.Mkdir(anchor, 0o755); err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, line := range strings.Split(string(script), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || strings.Contains(f[1], "\x00") || filepath.IsAbs(f[1]) {
				continue
			}
			p := filepath.Join(anchor, f[1])
			if !strings.HasPrefix(p, anchor+"/") {
				continue
			}
			switch {
			case f[0] == "d":
				_ = os.MkdirAll(p, 0o755)
			case f[0] == "l" && len(f) == 3:
				_ = os.Symlink(f[2], p)
			case f[0] == "m":
				// A mount point: a tmpfs the agent could not have made,
				// but a source may cross one.
				if os.MkdirAll(p, 0o755) == nil && unix.Mount("tmpfs", p, "tmpfs", 0, "size=64k") == nil {
					t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
				}
			case f[0] == "p":
				paths = append(paths, p)
			}
		}
		for _, p := range paths {
			for _, noLinks := range []bool{false, true} {
				h, err := HostDir{Anchor: anchor, Path: filepath.Clean(p), NoLinks: noLinks}.Open()
				if err != nil {
					continue
				}
				got := realPathOf(t, h)
				h.Close()
				if got != anchor && !strings.HasPrefix(got, anchor+"/") {
					t.Fatalf("%s beneath %s (noLinks %v) reached %s", p, anchor, noLinks, got)
				}
			}
		}
	})
}
