//go:build linux

package areas

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const testAgentID = 60123

// agentRoot is a directory owned by the test agent holding a root-only
// file and a root-owned directory, opened as a Root.
func agentRoot(t *testing.T) (*Root, string) {
	t.Helper()
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "workspace")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "root-only"), []byte("ROOT-ONLY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "root-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "root-dir", "kept"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, testAgentID, testAgentID); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot("/workspace", dir, false)
	if err != nil {
		t.Fatal(err)
	}
	return r, dir
}

// A root-only file inside a root is unreadable through file access that
// acts as the agent, whatever path reaches it; the same access as the
// controller reads it, so it is the identity that refuses.
func TestFileAccessActsAsTheAgent(t *testing.T) {
	r, dir := agentRoot(t)
	if b, err := r.Read("root-only"); err != nil || string(b) != "ROOT-ONLY\n" {
		t.Fatalf("as the controller: %q %v; the file must be readable by root for this test to mean anything", b, err)
	}
	as := r.As(Identity{UID: testAgentID, GID: testAgentID})
	checks := map[string]error{}
	_, checks["Read"] = as.Read("root-only")
	_, checks["Open"] = as.Open("root-only")
	checks["Write over"] = as.Write("root-dir/planted", []byte("x"), 0o644)
	checks["Remove"] = as.Remove("root-dir", true)
	for op, err := range checks {
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("%s of a root-only object as the agent: %v, want permission denied", op, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "root-dir", "kept")); err != nil {
		t.Fatalf("a file in the root-owned directory went: %v", err)
	}
	if err := as.Write("mine", []byte("agent\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "mine"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != testAgentID || st.Gid != testAgentID {
		t.Fatalf("a file written as the agent is owned by %d:%d, want %d", st.Uid, st.Gid, testAgentID)
	}
}

// The thread an access ran on is given back with the controller's ids and
// groups, so the rest of the process is never left acting as an agent,
// even with many accesses at once.
func TestActingAsTheAgentLeavesNoThreadChanged(t *testing.T) {
	r, _ := agentRoot(t)
	as := r.As(Identity{UID: testAgentID, GID: testAgentID})
	groups, err := unix.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				_, _ = as.Read("root-only")
				_, _ = as.List(".")
			}
		}()
	}
	wg.Wait()
	// Every thread the runtime has: each must read root's view.
	for range 64 {
		if uid, _ := unix.SetfsuidRetUid(-1); uid != 0 {
			t.Fatalf("a thread kept the agent's file-system uid %d", uid)
		}
		if g, _ := unix.Getgroups(); len(g) != len(groups) {
			t.Fatalf("a thread kept groups %v, want %v", g, groups)
		}
		if _, err := r.Read("root-only"); err != nil {
			t.Fatalf("the controller lost its own access: %v", err)
		}
	}
}

// chain makes n nested directories named d below dir, owned by uid, and
// returns the deepest.
func chain(t *testing.T, dir string, n int, uid int) string {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fchownat(fd, "d", uid, uid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	return filepath.Join(dir, strings.Repeat("d/", n))
}

// The agent decides how deep a tree is. A recursive remove holds a
// descriptor a level, so past its depth it stops with an error that says
// so, and a failure deep down is said once, with its depth, not wrapped
// again at every level above it (which grew as the square of the depth).
func TestRemoveOfADeepTree(t *testing.T) {
	r, dir := agentRoot(t)
	as := r.As(Identity{UID: testAgentID, GID: testAgentID})

	if err := os.Mkdir(filepath.Join(dir, "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "deep"), testAgentID, testAgentID); err != nil {
		t.Fatal(err)
	}
	chain(t, filepath.Join(dir, "deep"), maxRemoveDepth+4, testAgentID)
	err := as.Remove("deep", true)
	if !errors.Is(err, ErrTooDeep) || len(err.Error()) > 512 {
		t.Fatalf("removing a tree %d deep: %v; want ErrTooDeep in a short message", maxRemoveDepth+4, err)
	}

	// Within the depth, a root-owned directory at the bottom the agent
	// cannot empty.
	if err := os.Mkdir(filepath.Join(dir, "held"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "held"), testAgentID, testAgentID); err != nil {
		t.Fatal(err)
	}
	bottom := chain(t, filepath.Join(dir, "held"), maxRemoveDepth-2, testAgentID)
	if err := os.Mkdir(filepath.Join(bottom, "root-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bottom, "root-dir", "kept"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = as.Remove("held", true)
	if !errors.Is(err, fs.ErrPermission) || len(err.Error()) > 512 || !strings.Contains(err.Error(), fmt.Sprintf("%d directories down", maxRemoveDepth)) {
		t.Fatalf("removing a tree whose bottom the agent cannot empty: %.600v; want permission denied, its depth, in a short message", err)
	}
	if _, err := os.Stat(filepath.Join(bottom, "root-dir", "kept")); err != nil {
		t.Fatal(err)
	}
	// As the controller, within the depth, the whole tree goes.
	if err := r.Remove("held", true); err != nil {
		t.Fatal(err)
	}
}

// A directory with many entries is removed a batch of names at a time.
func TestRemoveOfAWideDirectory(t *testing.T) {
	r, dir := agentRoot(t)
	wide := filepath.Join(dir, "wide")
	if err := os.Mkdir(wide, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 3*removeDirBatch + 7 {
		if err := os.WriteFile(filepath.Join(wide, strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Remove("wide", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(wide); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the wide directory is still there: %v", err)
	}
}
