package bwrap

import (
	"os"
	"path/filepath"
	"testing"
)

// bwrap is looked up on PATH once, not at every pass and command, and
// again when the one found goes.
func TestBubblewrapIsLookedUpOnceAndAgainWhenItGoes(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	put := func(dir string) string {
		p := filepath.Join(dir, "bwrap")
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first, second := put(dirs[0]), put(dirs[1])
	t.Setenv("PATH", dirs[0]+string(os.PathListSeparator)+dirs[1])
	r := &Runtime{bwrap: "bwrap"}
	want := func(p string) {
		t.Helper()
		got, err := r.bubblewrap()
		if err != nil || got != p {
			t.Fatalf("bubblewrap() = %q, %v; want %s", got, err, p)
		}
	}
	want(first)

	// Found, it is not looked for again: one put earlier on PATH since
	// is not seen while the first is there.
	earlier := put(dirs[2])
	t.Setenv("PATH", dirs[2]+string(os.PathListSeparator)+dirs[0]+string(os.PathListSeparator)+dirs[1])
	want(first)

	// Gone, it is looked up again.
	if err := os.Remove(first); err != nil {
		t.Fatal(err)
	}
	want(earlier)
	// No longer executable is gone too.
	if err := os.Chmod(earlier, 0o644); err != nil {
		t.Fatal(err)
	}
	want(second)
	// None left: the error says so, and nothing is kept.
	if err := os.Remove(second); err != nil {
		t.Fatal(err)
	}
	if got, err := r.bubblewrap(); err == nil {
		t.Fatalf("bubblewrap() = %q with no bwrap on PATH", got)
	}
	if r.bwrapFound.Load() != nil {
		t.Fatal("a bwrap that is gone is still remembered")
	}
}
