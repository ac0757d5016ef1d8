//go:build linux

package areas

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	raceDuration = 2 * time.Second
	// minSwaps is far below what one core manages in raceDuration; falling
	// short means the swapper barely ran and the test proved nothing.
	minSwaps = 1000
)

// TestRaceComponentSwappedWithOutsideLink swaps the directory "sub" with a
// symbolic link to the outside directory in a tight loop, using
// RENAME_EXCHANGE so "sub" always exists as one or the other, while the
// API reads, writes, lists, creates and removes below "sub". No access may
// reach the outside directory.
func TestRaceComponentSwappedWithOutsideLink(t *testing.T) {
	tmp := t.TempDir()
	root := filepath.Join(tmp, "root")
	outside := filepath.Join(tmp, "outside")
	must(t, os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	must(t, os.MkdirAll(outside, 0o755))
	must(t, os.WriteFile(filepath.Join(root, "sub", "file"), []byte("inside"), 0o644))
	must(t, os.WriteFile(filepath.Join(outside, "file"), []byte(outsideSecret), 0o644))
	// One absolute and one relative link; both lead to the outside.
	must(t, os.Symlink(outside, filepath.Join(root, "swap-abs")))
	must(t, os.Symlink("../outside", filepath.Join(root, "swap-rel")))
	outsideBefore := snapshot(t, outside)

	r, err := OpenRoot("/workspace", root, false)
	if err != nil {
		t.Fatal(err)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	var swaps atomic.Int64
	swapErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sub := filepath.Join(root, "sub")
		links := []string{filepath.Join(root, "swap-abs"), filepath.Join(root, "swap-rel")}
		for i := 0; !stop.Load(); i++ {
			link := links[(i/2)%2]
			// Two exchanges put the directory back, so each pair leaves
			// the tree as it was and the next pair can use the other link.
			if err := unix.Renameat2(unix.AT_FDCWD, sub, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE); err != nil {
				swapErr <- err
				return
			}
			swaps.Add(1)
		}
	}()

	type tally struct{ ok, escape, other int }
	counts := map[string]*tally{}
	count := func(op string, err error) {
		c := counts[op]
		if c == nil {
			c = &tally{}
			counts[op] = c
		}
		switch {
		case err == nil:
			c.ok++
		case errors.Is(err, ErrEscape):
			c.escape++
		default:
			c.other++
		}
	}
	var escapes []string
	accesses := 0
	deadline := time.Now().Add(raceDuration)
	for time.Now().Before(deadline) {
		accesses++
		b, err := r.Read("sub/file")
		if err == nil && string(b) != "inside" {
			escapes = append(escapes, "Read returned "+string(b))
		}
		count("read", err)

		// ".." in the path makes openat2 check for concurrent renames.
		b, err = r.Read("sub/../sub/file")
		if err == nil && string(b) != "inside" {
			escapes = append(escapes, "Read with dotdot returned "+string(b))
		}
		count("read-dotdot", err)

		if f, err := r.Open("sub/file"); err == nil {
			got, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
			if err != nil || !strings.HasPrefix(got, realRoot+"/") {
				escapes = append(escapes, "Open opened "+got)
			}
			f.Close()
		}

		count("write", r.Write("sub/written", []byte("inside"), 0o644))
		ents, err := r.List("sub")
		for _, e := range ents {
			if e.Name == "file" && e.Size == int64(len(outsideSecret)) {
				escapes = append(escapes, "List saw the outside file")
			}
		}
		count("list", err)
		e, err := r.Stat("sub/file")
		if err == nil && e.Size != int64(len("inside")) {
			escapes = append(escapes, "Stat saw the outside file")
		}
		count("stat", err)
		count("mkdir", r.Mkdir("sub/d/e", true))
		count("remove", r.Remove("sub/d", true))
	}
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-swapErr:
		t.Fatalf("swapping: %v", err)
	default:
	}

	t.Logf("%d swaps, %d access rounds", swaps.Load(), accesses)
	for op, c := range counts {
		t.Logf("%-11s ok %6d  refused as escape %6d  other errors %6d", op, c.ok, c.escape, c.other)
	}
	if len(escapes) > 0 {
		t.Fatalf("%d escapes, first: %s", len(escapes), escapes[0])
	}
	if diff, ok := sameSnapshot(outsideBefore, snapshot(t, outside)); !ok {
		t.Fatalf("the outside directory changed: %s", diff)
	}
	if n := swaps.Load(); n < minSwaps {
		t.Fatalf("only %d swaps happened; want at least %d for the race to mean anything", n, minSwaps)
	}
	// Both outcomes must have happened, or the accesses never met the link.
	if counts["read"].ok == 0 || counts["read"].escape == 0 {
		t.Fatalf("reads never saw both states: %+v", *counts["read"])
	}
}
