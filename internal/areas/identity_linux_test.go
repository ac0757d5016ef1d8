//go:build linux

package areas

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "giving areas to agent ids needs root; CI runs as root")
	}
}

func ownerOf(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

func TestParseIDRange(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"2000000000:65536", true},
		{"100:1", true},
		{"0:10", false},
		{"10:0", false},
		{"10", false},
		{"-1:5", false},
		{"4294967290:10", false},
		{"x:1", false},
	} {
		_, err := ParseIDRange(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseIDRange(%q) error = %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}

func TestIdentitiesAreStableDistinctAndNeverRoot(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "areas")
	ids, err := NewIdentities(root, IDRange{First: 3000000000, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint32{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, agent := range []string{"alice", "bob", "carol"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := ids.For(agent)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[agent] = id
			mu.Unlock()
		}()
	}
	wg.Wait()
	seen := map[uint32]bool{}
	for agent, id := range got {
		if id == 0 || seen[id] || !ids.Range().Contains(id) {
			t.Fatalf("agent %s got id %d (all: %v)", agent, id, got)
		}
		seen[id] = true
		if uid, gid := ownerOf(t, filepath.Join(root, agent)); uid != id || gid != id {
			t.Fatalf("agent %s directory owned by %d:%d, want %d", agent, uid, gid, id)
		}
	}
	// A second allocator over the same root (a restarted controller) reads
	// the ids back from the directories.
	again, _ := NewIdentities(root, IDRange{First: 3000000000, Count: 3})
	for agent, id := range got {
		if id2, err := again.For(agent); err != nil || id2 != id {
			t.Fatalf("agent %s after restart: id %d, %v; want %d", agent, id2, err, id)
		}
	}
	if _, err := again.For("dave"); err == nil {
		t.Fatal("a fourth agent got an id from a range of three")
	}
}

func TestIdentitiesTakeOverRootOwnedAreasWithoutFollowingLinks(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "areas")
	ws := filepath.Join(root, "alice", "workspace")
	if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "sub", "notes"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(dir, "host-file")
	if err := os.WriteFile(host, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(dir, "host-dir")
	if err := os.Mkdir(hostDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// What an agent that ran as root could have left: a link to a host
	// directory and a hard link to a host file.
	if err := os.Symlink(hostDir, filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(host, filepath.Join(ws, "hard")); err != nil {
		t.Fatal(err)
	}
	ids, _ := NewIdentities(root, IDRange{First: 3000000100, Count: 10})
	id, err := ids.For("alice")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(root, "alice"), ws, filepath.Join(ws, "sub"), filepath.Join(ws, "sub", "notes"), filepath.Join(ws, "link")} {
		if uid, _ := ownerOf(t, p); uid != id {
			t.Errorf("%s owned by %d after take-over, want %d", p, uid, id)
		}
	}
	for _, p := range []string{host, hostDir} {
		if uid, _ := ownerOf(t, p); uid != 0 {
			t.Errorf("host path %s was given to the agent (owner %d)", p, uid)
		}
	}
}
