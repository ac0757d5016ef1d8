package overlay_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
)

// layers builds an upper and a lower layer as plain directories: Diff and
// Apply read and write them, they need no mount.
func layers(t *testing.T) (overlay.Layers, *areas.Root) {
	t.Helper()
	dir := t.TempDir()
	l := overlay.Layers{Lower: filepath.Join(dir, "lower"), Upper: filepath.Join(dir, "upper")}
	write(t, filepath.Join(l.Lower, "edit.txt"), "old\n")
	write(t, filepath.Join(l.Lower, "gone.txt"), "bye\n")
	write(t, filepath.Join(l.Upper, "edit.txt"), "reviewed\n")
	write(t, filepath.Join(l.Upper, "sub", "added.txt"), "added\n")
	if os.Geteuid() == 0 {
		if err := unix.Mknod(filepath.Join(l.Upper, "gone.txt"), unix.S_IFCHR|0o600, 0); err != nil {
			t.Fatal(err)
		}
	}
	lower, err := areas.OpenRoot("/workspace/project", l.Lower, false)
	if err != nil {
		t.Fatal(err)
	}
	return l, lower
}

// tree records every entry below dir, temporary files included.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := d.Info()
		b.WriteString(p + " " + fi.Mode().String())
		if d.Type().IsRegular() {
			c, _ := os.ReadFile(p)
			b.WriteString(" " + string(c))
		}
		b.WriteString("\n")
		return nil
	})
	return b.String()
}

func TestApplyRefusesChangesAfterReview(t *testing.T) {
	cases := []struct {
		name  string
		after func(t *testing.T, l overlay.Layers)
	}{
		{"content changed, same size", func(t *testing.T, l overlay.Layers) {
			write(t, filepath.Join(l.Upper, "edit.txt"), "REVIEWED\n")
		}},
		{"mode changed", func(t *testing.T, l overlay.Layers) {
			if err := os.Chmod(filepath.Join(l.Upper, "edit.txt"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"file added", func(t *testing.T, l overlay.Layers) {
			write(t, filepath.Join(l.Upper, "sub", "later.txt"), "unreviewed\n")
		}},
		{"file removed from the changes", func(t *testing.T, l overlay.Layers) {
			if err := os.Remove(filepath.Join(l.Upper, "sub", "added.txt")); err != nil {
				t.Fatal(err)
			}
		}},
		{"file swapped for a link", func(t *testing.T, l overlay.Layers) {
			p := filepath.Join(l.Upper, "edit.txt")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc/passwd", p); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory swapped for a link to another", func(t *testing.T, l overlay.Layers) {
			write(t, filepath.Join(l.Upper, "other", "added.txt"), "added\n")
			if err := os.RemoveAll(filepath.Join(l.Upper, "sub")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("other", filepath.Join(l.Upper, "sub")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, lower := layers(t)
			reviewed, err := l.Diff()
			if err != nil {
				t.Fatal(err)
			}
			digest := overlay.Digest(reviewed)
			before := tree(t, l.Lower)
			c.after(t, l)
			_, err = l.Apply(lower, digest)
			if !errors.Is(err, overlay.ErrDigestMismatch) || !strings.Contains(err.Error(), "nothing was applied") {
				t.Fatalf("Apply after the upper layer changed: want ErrDigestMismatch, got %v", err)
			}
			if after := tree(t, l.Lower); after != before {
				t.Fatalf("a refused apply changed the lower layer:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
}

func TestApplyWritesWhatWasReviewed(t *testing.T) {
	l, lower := layers(t)
	if err := os.Chmod(filepath.Join(l.Upper, "edit.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	changes, err := l.Diff()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		if c.Type == areas.TypeFile && (len(c.SHA256) != 64 || c.Mode == 0) {
			t.Fatalf("file change without hash or mode: %+v", c)
		}
	}
	applied, err := l.Apply(lower, overlay.Digest(changes))
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(changes) {
		t.Fatalf("applied %v of %v", applied, changes)
	}
	fi, err := os.Stat(filepath.Join(l.Lower, "edit.txt"))
	if b, _ := os.ReadFile(filepath.Join(l.Lower, "edit.txt")); err != nil || string(b) != "reviewed\n" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("edit.txt after apply: %q %v %v", b, fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(l.Lower, "sub", "added.txt")); string(b) != "added\n" {
		t.Fatalf("sub/added.txt after apply: %q", b)
	}
	if os.Geteuid() == 0 {
		if _, err := os.Stat(filepath.Join(l.Lower, "gone.txt")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("gone.txt after apply: %v", err)
		}
	}
	if strings.Contains(tree(t, l.Lower), ".areas-write-") {
		t.Fatal("a temporary file was left in the lower layer")
	}
}

func TestDigestQuotesNames(t *testing.T) {
	one := []overlay.Change{{Path: "a\nchanged file 0644 - \"b\"", Kind: overlay.Changed, Type: areas.TypeFile}}
	two := []overlay.Change{{Path: "a", Kind: overlay.Changed, Type: areas.TypeFile}, {Path: "b", Kind: overlay.Changed, Type: areas.TypeFile}}
	if overlay.Digest(one) == overlay.Digest(two) {
		t.Fatal("a name holding a newline passes for two changes")
	}
	if overlay.Digest(two) != overlay.Digest(append([]overlay.Change(nil), two...)) {
		t.Fatal("the digest is not stable")
	}
}

// TestDiffStreamsLargeFiles: a 512 MiB sparse file in the upper layer is
// hashed as it streams; the heap does not grow by its size.
func TestDiffStreamsLargeFiles(t *testing.T) {
	l, _ := layers(t)
	f, err := os.Create(filepath.Join(l.Upper, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(512 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := l.Diff(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Fatalf("diffing a 512 MiB file allocated %d MiB", grew>>20)
	}
}

// A name the agent chose is quoted in Apply's refusal, as in diff's
// listing: the refusal is printed on the reviewer's terminal, where a
// newline would forge a line and an escape sequence command the terminal.
func TestApplyRefusalQuotesNames(t *testing.T) {
	l, lower := layers(t)
	name := "x\x1b]0;applied\x07\nA file 0644 sha256:00 ok.txt"
	if err := os.Symlink("edit.txt", filepath.Join(l.Upper, name)); err != nil {
		t.Fatal(err)
	}
	changes, err := l.Diff()
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Apply(lower, overlay.Digest(changes))
	if err == nil || !strings.Contains(err.Error(), "only regular files") {
		t.Fatalf("a link among the changes must be refused: %v", err)
	}
	if strings.ContainsAny(err.Error(), "\x1b\x07\n") {
		t.Fatalf("the refusal holds the name's control characters: %q", err.Error())
	}
}
