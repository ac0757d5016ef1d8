package mounttree

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// A tree's mounts are clones of the mounts holding their sources. On a
// host whose mounts are shared (/ under systemd; a Pod's volume with
// Bidirectional propagation) a clone joined its source's peer group, so:
//   - a custom mount made in the tree appeared at its destination in the
//     agent's area on the host too;
//   - detaching a tree unmounted, on the host, a mount below the agent's
//     area that no tree made;
//   - an agent that moved a destination's directory aside a few times, so
//     that each command built a new generation and the clean-up detached
//     the oldest, stripped the custom mount out of its newest tree: its
//     commands then saw its own directory where the read-only mount
//     belonged.
//
// Here the "host" is a tmpfs of the test's own, made shared.
func TestTreeMountsStayOutOfASharedHostMount(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mount trees are built only as root: run the tests as root (CI does)")
	}
	dir := t.TempDir()
	host := filepath.Join(dir, "host")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("host", host, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(host, unix.MNT_DETACH) })
	if err := unix.Mount("", host, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(host, "areas", "ada", "workspace")
	src := filepath.Join(host, "srv", "ref")
	admin := filepath.Join(ws, "data")
	for _, d := range []string{ws, src, admin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "from-source"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A mount of the host's below the agent's area, which no tree made.
	if err := unix.Mount("admin", admin, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(admin, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(admin, "admins"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	trees := filepath.Join(dir, "trees")
	if err := MakeTreesMount(trees); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(t, trees) })

	g := Generations{Dir: filepath.Join(trees, "x", "cireilclaw-ada")}
	tr := Tree{
		Workspace: "workspace",
		Owner:     2000000000,
		Areas:     []Area{{Name: "workspace", Source: areas.HostDir{Path: ws}}},
		Binds:     []Bind{{Source: areas.HostDir{Path: src}, Rel: "d/ref", ReadOnly: true}},
	}
	t.Cleanup(func() { _ = g.Remove() })
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	build := func(what string) {
		t.Helper()
		built, err := g.Build(tr)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		tr.Dir = built
		if err := tr.Verify(); err != nil {
			t.Fatalf("%s: the tree just built does not verify: %v", what, err)
		}
		if !exists(filepath.Join(built, "workspace", "d", "ref", "from-source")) {
			t.Fatalf("%s: the tree's custom mount does not hold its source", what)
		}
		if exists(filepath.Join(ws, "d", "ref", "from-source")) {
			t.Fatalf("%s: the custom mount appeared on the host, in the agent's area at %s", what, filepath.Join(ws, "d", "ref"))
		}
		if !exists(filepath.Join(admin, "admins")) {
			t.Fatalf("%s: the host's own mount at %s was unmounted", what, admin)
		}
	}
	build("the first tree")
	// The agent moves the destination's directory aside before each
	// command: each finds its tree changed and builds a generation, and
	// the clean-up detaches the oldest.
	for i := range 6 {
		if err := os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, fmt.Sprintf("moved-%d", i))); err != nil {
			t.Fatal(err)
		}
		if tr.Verify() == nil {
			t.Fatalf("generation %d: a tree whose destination moved still verifies", i)
		}
		build(fmt.Sprintf("generation %d", i+1))
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(admin, "admins")) {
		t.Fatalf("removing the trees unmounted the host's own mount at %s", admin)
	}
}
