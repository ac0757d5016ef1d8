package mounttree

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// Verify of a tree just built holds, and closes exactly the descriptors it
// opened: verifyAreas once closed the workspace's descriptor on its way
// out as well, so Verify read the custom mounts through a closed (or by
// then another goroutine's) descriptor and closed it a second time, which
// a concurrent command start saw as EBADF.
func TestVerifyKeepsItsDescriptorsToItself(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mount trees are built only as root: run the tests as root (CI does)")
	}
	dir := t.TempDir()
	for _, d := range []string{"ws", "src/inside"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tr := Tree{
		Dir:       filepath.Join(dir, "tree"),
		Workspace: "workspace",
		Areas:     []Area{{Name: "workspace", Source: areas.HostDir{Path: filepath.Join(dir, "ws")}}},
		Binds:     []Bind{{Source: areas.HostDir{Path: filepath.Join(dir, "src")}, Rel: "project"}},
	}
	if err := tr.Build(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = Remove(tr.Dir) }()

	for range 20 {
		// A descriptor of the test's own, opened where a number the
		// verification freed would be handed out next.
		canary, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Verify(); err != nil {
			t.Fatalf("Verify of a tree just built: %v", err)
		}
		if err := tr.VerifyAreas(); err != nil {
			t.Fatalf("VerifyAreas of a tree just built: %v", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(canary, &st); err != nil {
			t.Fatalf("a descriptor Verify did not open was closed under it: %v", err)
		}
		unix.Close(canary)
	}
}
