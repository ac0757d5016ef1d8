package controllers

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestStatusDirty(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		dirty     bool
		err       bool
	}{
		{name: "clean", out: "# branch.oid 4f2304e1\n# branch.head s2\n"},
		{name: "clean, detached", out: "# branch.oid 4f2304e1\n# branch.head (detached)\n"},
		{name: "untracked file", out: "# branch.oid 4f2304e1\n# branch.head s2\n? draft.txt\n", dirty: true},
		{name: "changed file", out: "# branch.oid 4f2304e1\n# branch.head s2\n1 .M N... 100644 100644 100644 ce01 ce01 README\n", dirty: true},
		{name: "changes whatever came of the header", out: "? draft.txt\n", dirty: true},
		{name: "nothing at all", out: "", err: true},
		{name: "headers but not the branch's", out: "# branch.head s2\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirty, err := statusDirty(tc.out)
			if dirty != tc.dirty || (err != nil) != tc.err {
				t.Fatalf("statusDirty(%q) = %v, %v; want dirty %v, error %v", tc.out, dirty, err, tc.dirty, tc.err)
			}
		})
	}
}

func TestDetachedAway(t *testing.T) {
	const made = "4f2304e1"
	for _, tc := range []struct {
		name, out string
		away      bool
	}{
		{name: "on a branch", out: "# branch.oid 9a81c0d2\n# branch.head s2\n"},
		{name: "detached where it was made", out: "# branch.oid 4f2304e1\n# branch.head (detached)\n"},
		{name: "detached after commits", out: "# branch.oid 9a81c0d2\n# branch.head (detached)\n", away: true},
		{name: "detached, no commit read", out: "# branch.head (detached)\n", away: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := detachedAway(tc.out, made); got != tc.away {
				t.Fatalf("detachedAway(%q, %q) = %v, want %v", tc.out, made, got, tc.away)
			}
		})
	}
}

// A claim taking a worktree waits for another's release of it, gives up
// with its context, and a worktree no one holds leaves nothing behind.
func TestWorktreeLocks(t *testing.T) {
	var l worktreeLocks
	unlock, err := l.lock(context.Background(), "/repo/.worktrees/a")
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.lock(context.Background(), "/repo/.worktrees/b")
	if err != nil {
		t.Fatalf("another worktree waits: %v", err)
	}
	other()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.lock(ctx, "/repo/.worktrees/a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a held worktree: %v, want the context's deadline", err)
	}
	unlock()
	again, err := l.lock(context.Background(), "/repo/.worktrees/a")
	if err != nil {
		t.Fatal(err)
	}
	again()
	if len(l.held) != 0 {
		t.Fatalf("%d worktree(s) still held", len(l.held))
	}
}
