//go:build linux

package areas

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
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
