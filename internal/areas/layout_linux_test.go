//go:build linux

package areas

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The Sandbox reconciler lays an agent's areas out at every pass: what is
// already in place is not written again, and what is not is mended.
func TestLayoutLeavesAreasInPlaceAlone(t *testing.T) {
	requireRoot(t)
	const agent = 2000000123
	dir := filepath.Join(t.TempDir(), "areas", "ada")
	names := []string{"workspace", "memories"}
	if err := Layout(dir, names, agent); err != nil {
		t.Fatal(err)
	}
	all := []string{dir, filepath.Join(dir, names[0]), filepath.Join(dir, names[1])}
	ctimes := map[string]syscall.Timespec{}
	for _, p := range all {
		if u, g := ownerOf(t, p); u != agent || g != agent {
			t.Fatalf("%s belongs to %d:%d, want the agent's %d", p, u, g, agent)
		}
		ctimes[p] = ctimeOf(t, p)
	}
	// Past the clock's grain, so that a write would show.
	time.Sleep(20 * time.Millisecond)
	if err := Layout(dir, names, agent); err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		if got := ctimeOf(t, p); got != ctimes[p] {
			t.Errorf("laying out areas already in place changed %s (its ctime moved from %v to %v): a pass writes nothing that is already so", p, ctimes[p], got)
		}
	}

	// One that no longer belongs to the agent is given back.
	ws := filepath.Join(dir, names[0])
	if err := os.Lchown(ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := Layout(dir, names, agent); err != nil {
		t.Fatal(err)
	}
	if u, g := ownerOf(t, ws); u != agent || g != agent {
		t.Errorf("%s belongs to %d:%d after a layout, want the agent's %d", ws, u, g, agent)
	}
}

func ctimeOf(t *testing.T, p string) syscall.Timespec {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ctim
}
