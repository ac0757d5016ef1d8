package overlay_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mounted(t *testing.T) (overlay.Layers, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (overlay mounts need CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	lower := filepath.Join(dir, "project")
	write(t, filepath.Join(lower, "keep.txt"), "keep\n")
	write(t, filepath.Join(lower, "edit.txt"), "old\n")
	write(t, filepath.Join(lower, "gone.txt"), "bye\n")
	l := overlay.For(filepath.Join(dir, "agent"), lower, "project")
	if err := l.Mount(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return l, dir
}

func TestOverlayKeepsTheSourceUntilApplied(t *testing.T) {
	l, dir := mounted(t)
	if ok, err := l.Mounted(); err != nil || !ok {
		t.Fatalf("Mounted = %v, %v", ok, err)
	}
	if err := l.Mount(); err != nil {
		t.Fatalf("a second Mount must be a no-op: %v", err)
	}
	write(t, filepath.Join(l.Merged, "edit.txt"), "new\n")
	write(t, filepath.Join(l.Merged, "sub", "added.txt"), "added\n")
	if err := os.Remove(filepath.Join(l.Merged, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(l.Lower, "edit.txt")); string(b) != "old\n" {
		t.Fatalf("the source changed before apply: %q", b)
	}

	changes, err := l.Diff()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, string(c.Kind)+" "+c.Path)
	}
	want := "changed edit.txt,deleted gone.txt,added sub,added sub/added.txt"
	if strings.Join(got, ",") != want {
		t.Fatalf("Diff = %q, want %q", strings.Join(got, ","), want)
	}

	// A link the sandbox leaves in its changes must not be followed.
	outside := filepath.Join(dir, "secret")
	write(t, outside, "host secret\n")
	if err := os.Symlink(outside, filepath.Join(l.Merged, "link.txt")); err != nil {
		t.Fatal(err)
	}
	lower, err := areas.OpenRoot("/workspace/project", l.Lower, false)
	if err != nil {
		t.Fatal(err)
	}
	withLink, err := l.Diff()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Apply(lower, overlay.Digest(withLink)); err == nil || !strings.Contains(err.Error(), "link.txt") {
		t.Fatalf("Apply with a symbolic link among the changes: want an error naming it, got %v", err)
	}
	if err := os.Remove(filepath.Join(l.Merged, "link.txt")); err != nil {
		t.Fatal(err)
	}
	if changes, err = l.Diff(); err != nil {
		t.Fatal(err)
	}
	applied, err := l.Apply(lower, overlay.Digest(changes))
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 4 {
		t.Fatalf("applied %v", applied)
	}
	for p, want := range map[string]string{"edit.txt": "new\n", "sub/added.txt": "added\n", "keep.txt": "keep\n"} {
		if b, err := os.ReadFile(filepath.Join(l.Lower, p)); err != nil || string(b) != want {
			t.Fatalf("after apply %s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(l.Lower, "gone.txt")); !os.IsNotExist(err) {
		t.Fatalf("deleted file still in the source: %v", err)
	}
	if size, err := l.Size(); err != nil || size == 0 {
		t.Fatalf("Size = %d, %v", size, err)
	}
}

// A size limit set on an overlay that already holds changes moves them
// onto the layer's sized file system: none is lost, and from then on a
// write beyond the limit fails.
func TestASizeLimitKeepsTheChangesMadeBeforeIt(t *testing.T) {
	l, _ := mounted(t)
	write(t, filepath.Join(l.Merged, "edit.txt"), "new\n")
	if err := os.Remove(filepath.Join(l.Merged, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	if err := l.Unmount(); err != nil {
		t.Fatal(err)
	}
	sized := l.Sized(256 << 10)
	if err := sized.Mount(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sized.Unmount(); err != nil {
			t.Error(err)
		}
	})
	if b, _ := os.ReadFile(filepath.Join(sized.Merged, "edit.txt")); string(b) != "new\n" {
		t.Errorf("a change made before the limit: %q", b)
	}
	if _, err := os.Stat(filepath.Join(sized.Merged, "gone.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deletion made before the limit came undone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(l.Upper), "upper.moved", "edit.txt")); err != nil {
		t.Errorf("the old upper layer is not kept as upper.moved: %v", err)
	}
	err := os.WriteFile(filepath.Join(sized.Merged, "big"), make([]byte, 1<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("1 MiB written under a 256 KiB limit: %v, want ENOSPC", err)
	}
	if used, size, ok, err := sized.DiskUsage(); err != nil || !ok || size > 256<<10 || used > size {
		t.Errorf("DiskUsage = %d of %d, %v, %v", used, size, ok, err)
	}
}

// Changes that do not fit a new sizeLimit stay where they were, and no
// half-filled layer is left to hide them: the next mount tries again.
func TestChangesThatDoNotFitASizeLimitStay(t *testing.T) {
	l, _ := mounted(t)
	write(t, filepath.Join(l.Merged, "big"), strings.Repeat("x", 512<<10))
	if err := l.Unmount(); err != nil {
		t.Fatal(err)
	}
	sized := l.Sized(64 << 10)
	err := sized.Mount()
	if err == nil || !strings.Contains(err.Error(), "could not move") {
		_ = sized.Unmount()
		t.Fatalf("Mount = %v, want the changes said not to fit", err)
	}
	if fi, err := os.Stat(filepath.Join(l.Upper, "big")); err != nil || fi.Size() != 512<<10 {
		t.Fatalf("the old changes: %v, %v", fi, err)
	}
	if _, err := os.Stat(sized.Disk + ".img"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a half-filled layer was left: %v", err)
	}
}

// The agent changes its upper layer while the controller measures it, as
// root. A directory it swaps for a link to the host's tree between the
// walk's listing and its opening is never walked: no measure ever counts
// a host file, however the two interleave.
func TestSizeNeverWalksALinkSwappedIn(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host")
	write(t, filepath.Join(host, "secret"), "")
	if err := os.Truncate(filepath.Join(host, "secret"), 1<<30); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(dir, "upper")
	write(t, filepath.Join(upper, "a"), "0123456789")
	write(t, filepath.Join(upper, "z", "small"), "01234")
	l := overlay.Layers{Upper: upper}
	if size, err := l.Size(); err != nil || size != 15 {
		t.Fatalf("Size = %d, %v; want 15", size, err)
	}

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		z, real := filepath.Join(upper, "z"), filepath.Join(upper, "z.real")
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.Rename(z, real)
			_ = os.Symlink(host, z)
			_ = os.Remove(z)
			_ = os.Rename(real, z)
		}
	}()
	defer func() { close(stop); <-done }()
	walks, errs := 0, 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) || walks < 200; walks++ {
		size, err := l.Size()
		if err != nil {
			errs++
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("a failed measure names a host file: %v", err)
			}
			continue
		}
		// A rename under way may show z under both its names (20
		// bytes); only the host's tree holds a gibibyte.
		if size > 20 {
			t.Fatalf("walk %d counted %d bytes: it walked the host's tree through a link swapped in", walks, size)
		}
	}
	t.Logf("%d measures, %d failed", walks, errs)
}

// TestUnmountNeverFollowsALinkToAnotherMount puts a link where the agent's
// overlay directory was, leading to another overlay of the host's, as the
// agent who owns the directories around its layers could. The unmount, run
// as root when the instance goes, must leave the host's overlay mounted:
// it resolves the merged view beneath the areas root without links and
// unmounts the mount it holds.
func TestUnmountNeverFollowsALinkToAnotherMount(t *testing.T) {
	host, dir := mounted(t)
	agent := overlay.For(filepath.Join(dir, "areas", "alice"), filepath.Join(dir, "project"), "project")
	base := filepath.Dir(agent.Merged)
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		t.Fatal(err)
	}
	// The host's overlay's directory, where the agent's would be.
	if err := os.Symlink(filepath.Dir(host.Merged), base); err != nil {
		t.Fatal(err)
	}
	if ok, err := agent.Mounted(); err == nil && ok {
		t.Errorf("the agent's overlay is told mounted through a link to the host's")
	}
	_ = agent.Unmount()
	if ok, err := host.Mounted(); err != nil || !ok {
		t.Fatalf("the host's overlay is gone after the agent's unmount through a link (mounted %v, %v)", ok, err)
	}
}
