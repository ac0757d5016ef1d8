package startns

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestOutermost(t *testing.T) {
	got := outermost([]string{"/t/a/b-c", "/t/a/b/x", "/t/a/b", "/t/d", "/t/a/b"})
	want := []string{"/t/d", "/t/a/b", "/t/a/b-c"}
	if !slices.Equal(got, want) {
		t.Fatalf("outermost = %q, want %q", got, want)
	}
}

// A seed that could not be made is tried again, but no more often than
// its retry.
func TestASeedThatFailedIsTriedAgainLater(t *testing.T) {
	calls := 0
	fail := true
	k := seedKeeper{retry: time.Minute, make: func() (int, error) {
		calls++
		if fail {
			return -1, errors.New("out of descriptors")
		}
		return 7, nil
	}}
	t0 := time.Unix(1_000_000, 0)
	if _, err := k.get(t0); err == nil || calls != 1 {
		t.Fatalf("first try: err %v, %d calls", err, calls)
	}
	fail = false
	if _, err := k.get(t0.Add(30 * time.Second)); err == nil || calls != 1 {
		t.Fatalf("within the retry: err %v, %d calls; want the last error and no new try", err, calls)
	}
	if fd, err := k.get(t0.Add(time.Minute)); err != nil || fd != 7 || calls != 2 {
		t.Fatalf("after the retry: fd %d, err %v, %d calls", fd, err, calls)
	}
	if fd, err := k.get(t0.Add(2 * time.Minute)); err != nil || fd != 7 || calls != 2 {
		t.Fatalf("once made: fd %d, err %v, %d calls; want the same seed, no new try", fd, err, calls)
	}
}

// An option ForBubblewrap does not know might take a source, and a
// descriptor it is not given names a path it cannot tell: the start then
// has all of the host's mounts.
func TestABubblewrapOptionNotKnownNeedsTheWholeHost(t *testing.T) {
	for _, args := range [][]string{
		{"--unshare-all", "--overlay-src", "/srv", "--", "true"},
		{"--ro-bind", "/usr"},
		{"--bind-fd", "3", "/workspace/.git", "--", "true"},
		{"--ro-bind-fd", "x", "/usr", "--", "true"},
	} {
		if h := ForBubblewrap(args, nil); h != nil {
			t.Errorf("ForBubblewrap(%q) = %+v, want nil", args, h)
		}
	}
}
