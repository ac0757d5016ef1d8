//go:build linux

package areas

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// TestTakeOverNeverGivesAHardLinkSwappedIn exchanges, in a tight loop, a
// name of an area between a file of the area and a hard link to a host
// file, while the area is taken over again and again. The take-over decides
// by a name's link count; had it then acted on the name, the host file
// would be given to the agent whenever the exchange fell between the two.
func TestTakeOverNeverGivesAHardLinkSwappedIn(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	area := filepath.Join(dir, "areas", "alice")
	must(t, os.MkdirAll(area, 0o700))
	host := filepath.Join(dir, "host-file")
	must(t, os.WriteFile(host, []byte("host"), 0o600))
	own := filepath.Join(area, "own")
	must(t, os.WriteFile(own, []byte("agent"), 0o644))
	hard := filepath.Join(area, "hard")
	must(t, os.Link(host, hard))

	var stop atomic.Bool
	var swaps atomic.Int64
	swapErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if err := unix.Renameat2(unix.AT_FDCWD, own, unix.AT_FDCWD, hard, unix.RENAME_EXCHANGE); err != nil {
				swapErr <- err
				return
			}
			swaps.Add(1)
		}
	}()
	const id = 3000000200
	var given int
	deadline := time.Now().Add(raceDuration)
	for i := 0; time.Now().Before(deadline) || swaps.Load() < minSwaps; i++ {
		if err := giveTree(area, id); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("take-over %d: %v", i, err)
		}
		if uid, _ := ownerOf(t, host); uid != 0 {
			given++
			must(t, os.Lchown(host, 0, 0))
		}
		if i > 1_000_000 {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-swapErr:
		t.Fatalf("exchanging the names: %v", err)
	default:
	}
	if swaps.Load() < minSwaps {
		t.Fatalf("only %d exchanges ran: the race was not tried", swaps.Load())
	}
	if given > 0 {
		t.Fatalf("the host file was given to the agent %d times in %d exchanges", given, swaps.Load())
	}
}
