package areas

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Each gives every entry once, a batch at a time, refuses a directory of
// more than its bound before giving any, and ends with its callback's
// error.
func TestEachGivesEveryEntryOnceABatchAtATime(t *testing.T) {
	dir := t.TempDir()
	const n = 1000
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot("/workspace", dir, false)
	if err != nil {
		t.Fatal(err)
	}

	seen := map[string]int{}
	batches := 0
	if err := r.Each(".", MaxListEntries, func(batch []Entry) error {
		batches++
		if len(batch) > eachBatch {
			t.Errorf("a batch of %d entries, more than %d", len(batch), eachBatch)
		}
		for _, e := range batch {
			seen[e.Name]++
			if e.Name == "link" && e.Type != TypeSymlink {
				t.Errorf("the link is listed as %s: it was followed", e.Type)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n+1 || batches < (n+1)/eachBatch {
		t.Fatalf("%d names in %d batches, want %d", len(seen), batches, n+1)
	}
	for name, k := range seen {
		if k != 1 {
			t.Errorf("%s given %d times", name, k)
		}
	}

	given := 0
	err = r.Each(".", n, func(batch []Entry) error { given += len(batch); return nil })
	if !errors.Is(err, ErrTooManyEntries) || given != 0 {
		t.Fatalf("a directory past the bound: %v, %d entries given first", err, given)
	}

	stop := errors.New("stop")
	calls := 0
	if err := r.Each(".", MaxListEntries, func([]Entry) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("the callback's error: %v after %d calls", err, calls)
	}
}
