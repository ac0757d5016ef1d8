package controllers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// long is a bound no wait in these tests may reach: a wait that returns
// at all returned for the reason the test gives it.
const long = time.Hour

// waitReturns runs w.wait in the background and reports when it returns.
func waitReturns(ctx context.Context, w *claimWrites, sb types.NamespacedName) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		w.wait(ctx, sb)
		close(out)
	}()
	return out
}

// mustReturn fails the test unless returned is closed; a minute is more
// than any wait here may take but the one with a bound of an hour.
func mustReturn(t *testing.T, returned <-chan struct{}, failure string) {
	t.Helper()
	select {
	case <-returned:
	case <-time.After(time.Minute):
		t.Fatal(failure)
	}
}

// noneKept fails the test if w keeps any entry.
func noneKept(t *testing.T, w *claimWrites) {
	t.Helper()
	w.mu.Lock()
	left := len(w.pending)
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("expired entries kept: %d Sandboxes", left)
	}
}

func TestClaimWritesGoFirst(t *testing.T) {
	sb := types.NamespacedName{Namespace: "team", Name: "sb"}
	other := types.NamespacedName{Namespace: "team", Name: "other"}
	claim := types.NamespacedName{Namespace: "team", Name: "c"}
	ctx := context.Background()
	// alone is the record of one Sandbox pass running, whose waits are
	// bounded by an hour.
	alone := func() *claimWrites {
		w := newClaimWrites()
		w.bound = long
		w.enter()
		return w
	}

	t.Run("a Sandbox's write waits for its claim's and goes when it is done", func(t *testing.T) {
		w := alone()
		w.expect(sb, claim)
		w.expect(other, claim)
		returned := waitReturns(ctx, w, sb)
		// Another Sandbox's claim is not this one's.
		w.done(other, claim)
		select {
		case <-returned:
			t.Fatal("the Sandbox's write went while its claim's was under way")
		case <-time.After(50 * time.Millisecond):
		}
		w.done(sb, claim)
		mustReturn(t, returned, "the Sandbox's write still waits after its claim's was done")
	})

	t.Run("nothing under way: no wait", func(t *testing.T) {
		w := alone()
		w.expect(other, claim)
		// A done of a claim never expected changes nothing.
		w.done(sb, claim)
		mustReturn(t, waitReturns(ctx, w, sb), "waited with no claim write of its own under way")
	})

	t.Run("with other Sandbox passes running, no wait", func(t *testing.T) {
		w := alone()
		w.enter()
		w.expect(sb, claim)
		mustReturn(t, waitReturns(ctx, w, sb), "held a worker while another Sandbox pass ran")
		w.leave()
		if got := w.passes.Load(); got != 1 {
			t.Errorf("passes: got %d, want 1", got)
		}
	})

	t.Run("the wait is bounded", func(t *testing.T) {
		w := newClaimWrites()
		w.bound = 20 * time.Millisecond
		w.enter()
		w.expect(sb, claim)
		mustReturn(t, waitReturns(ctx, w, sb), "the wait outlasted its bound")
		// The entry whose pass never came has expired: the next wait drops
		// it and goes at once.
		w.wait(ctx, sb)
		noneKept(t, w)
	})

	t.Run("a cancelled pass does not wait", func(t *testing.T) {
		w := alone()
		w.expect(sb, claim)
		cctx, cancel := context.WithCancel(ctx)
		returned := waitReturns(cctx, w, sb)
		cancel()
		mustReturn(t, returned, "waited past the pass's context")
	})

	t.Run("many Sandboxes' expired entries are swept", func(t *testing.T) {
		w := newClaimWrites()
		w.bound = time.Millisecond
		for i := range pendingSweep + 10 {
			w.expect(types.NamespacedName{Namespace: "team", Name: string(rune('a'+i%26)) + string(rune('a'+i/26))}, claim)
		}
		time.Sleep(5 * time.Millisecond)
		w.enter()
		w.wait(ctx, sb)
		noneKept(t, w)
	})
}

// A notice expects the write of each claim it sends, before sending it
// (the claim's pass may be over before announce goes on), and none of a
// claim it could not send.
func TestNoticesExpectTheClaimWritesTheySetOff(t *testing.T) {
	read := noticeSandbox("7", metav1.ConditionFalse, v1alpha1.ReasonStopped)
	started := noticeSandbox("7", metav1.ConditionTrue, v1alpha1.ReasonRunning)
	sbKey := types.NamespacedName{Namespace: "team", Name: "sb"}
	pending := func(w *claimWrites) map[types.NamespacedName]time.Time {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.pending[sbKey]
	}

	n := newReadyNotices()
	n.writes = newClaimWrites()
	n.writes.bound = long
	n.announce([2]string{"6", "7"}, read, started, []v1alpha1.SessionClaim{
		noticeClaim("waiting", false, false, false),
		noticeClaim("ready-already", true, false, false),
	})
	got := pending(n.writes)
	if _, ok := got[types.NamespacedName{Namespace: "team", Name: "waiting"}]; !ok || len(got) != 1 {
		t.Fatalf("expected writes: got %v, want the claim sent alone", got)
	}

	full := newReadyNotices()
	full.writes = newClaimWrites()
	full.writes.bound = long
	for len(full.claims) < cap(full.claims) {
		full.claims <- event.GenericEvent{}
	}
	full.announce([2]string{"6", "7"}, read, started, []v1alpha1.SessionClaim{noticeClaim("waiting", false, false, false)})
	if got := pending(full.writes); len(got) != 0 {
		t.Errorf("a claim the full channel dropped is still expected: %v", got)
	}
}
