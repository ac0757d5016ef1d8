//go:build linux

package areas

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// forgetIndex is a process starting: it knows nothing of the index.
func forgetIndex(root string) {
	indexMemosMu.Lock()
	defer indexMemosMu.Unlock()
	delete(indexMemos, root)
}

func allocate(t *testing.T, ids *Identities, agents ...string) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for _, a := range agents {
		id, err := ids.For(a)
		if err != nil {
			t.Fatal(err)
		}
		out[a] = id
	}
	return out
}

// The index is a cache of the directories' owners: without it, or with it
// half built, the owners are read again and no id is handed out twice.
func TestIdentityIndexIsRebuiltFromTheOwners(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "areas")
	r := IDRange{First: 3000000100, Count: 4}
	ids, _ := NewIdentities(root, r)
	got := allocate(t, ids, "a", "b")
	for _, damage := range []func(){
		// Gone while this process knows it: the next allocation's claim
		// of a taken id would succeed, so the index must be rebuilt
		// first; a new process always rebuilds it.
		func() {
			_ = os.RemoveAll(filepath.Join(root, indexDir))
			forgetIndex(root)
		},
		// Half built: one entry lost.
		func() {
			_ = os.Remove(filepath.Join(root, indexDir, fmt.Sprint(got["a"])))
			forgetIndex(root)
		},
	} {
		damage()
		again, _ := NewIdentities(root, r)
		c, err := again.For(fmt.Sprintf("c%d", len(got)))
		if err != nil {
			t.Fatal(err)
		}
		for agent, id := range got {
			if id == c {
				t.Fatalf("a new agent got %d, the id of %s", c, agent)
			}
		}
		got[fmt.Sprintf("c%d", len(got))] = c
	}
}

// A directory made behind the index's back (an older controller, a
// person) changes the root, and the index reads the owners again.
func TestDirectoryMadeBehindTheIndexIsSeen(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "areas")
	r := IDRange{First: 3000000200, Count: 3}
	ids, _ := NewIdentities(root, r)
	a := allocate(t, ids, "a")["a"]
	// The next id the cursor would give, taken by hand.
	x := filepath.Join(root, "x")
	if err := os.Mkdir(x, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(x, int(a+1), int(a+1)); err != nil {
		t.Fatal(err)
	}
	c := allocate(t, ids, "c")["c"]
	if c == a || c == a+1 {
		t.Fatalf("agent c got %d: a has %d and x was made with %d", c, a, a+1)
	}
}

// A removed agent's id comes back once the range has wrapped: its entry
// in the index names a directory that id no longer owns.
func TestIdentityOfARemovedAgentComesBack(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "areas")
	ids, _ := NewIdentities(root, IDRange{First: 3000000300, Count: 2})
	got := allocate(t, ids, "a", "b")
	if err := os.RemoveAll(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	if c := allocate(t, ids, "c")["c"]; c != got["a"] {
		t.Fatalf("agent c got %d; the only free id is %d, a's", c, got["a"])
	}
	if _, err := ids.For("d"); err == nil {
		t.Fatal("a third agent got an id from a range of two")
	}
}

// Allocators over one root (two processes: each takes the root's lock
// file) never hand out one id twice.
func TestIdentitiesOfTwoAllocatorsAreDistinct(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "areas")
	r := IDRange{First: 3000000400, Count: 100}
	one, _ := NewIdentities(root, r)
	two, _ := NewIdentities(root, r)
	var mu sync.Mutex
	seen := map[uint32]string{}
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := one
			if i%2 == 1 {
				ids = two
			}
			agent := fmt.Sprintf("agent-%d", i)
			id, err := ids.For(agent)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if other, dup := seen[id]; dup {
				t.Errorf("%s and %s both got %d", agent, other, id)
			}
			seen[id] = agent
		}()
	}
	wg.Wait()
}

// Allocating 10,000 ids, beside making, giving and renaming 10,000
// directories with no allocation at all, in the same process: the index
// makes an id cost a constant, so the ratio stays near 1 however many
// agents there are (scanning the root for a free id made it grow with
// them).
func BenchmarkAllocate10000AgentIDs(b *testing.B) {
	if os.Geteuid() != 0 {
		testenv.Missing(b, "root", "giving directories to agent ids needs root; CI runs as root")
	}
	const n = 10000
	var alloc, base time.Duration
	for range b.N {
		root := filepath.Join(b.TempDir(), "areas")
		ids, _ := NewIdentities(root, IDRange{First: 3000100000, Count: n})
		start := time.Now()
		for i := range n {
			if _, err := ids.For(fmt.Sprintf("agent-%d", i)); err != nil {
				b.Fatal(err)
			}
		}
		alloc += time.Since(start)

		plain := filepath.Join(b.TempDir(), "plain")
		if err := os.Mkdir(plain, 0o711); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		for i := range n {
			tmp, dir := filepath.Join(plain, fmt.Sprintf(".new-%d", i)), filepath.Join(plain, fmt.Sprintf("agent-%d", i))
			if err := os.Mkdir(tmp, 0o700); err != nil {
				b.Fatal(err)
			}
			if err := os.Lchown(tmp, 3000200000+i, 3000200000+i); err != nil {
				b.Fatal(err)
			}
			if err := os.Rename(tmp, dir); err != nil {
				b.Fatal(err)
			}
		}
		base += time.Since(start)
	}
	b.ReportMetric(float64(alloc.Microseconds())/float64(b.N*n), "µs/id")
	b.ReportMetric(float64(base.Microseconds())/float64(b.N*n), "µs/dir-baseline")
	b.ReportMetric(float64(alloc)/float64(base), "x-baseline")
}
