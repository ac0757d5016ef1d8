package controllers

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// A claim's Ready is what its user waits for. Its status write and its
// Sandbox's (the claim count, Ready on a start) used to go side by side,
// sharing the API server, and the claim's came back later than it would
// alone: a cold claim took about a fifth longer. claimWrites lets the
// claims go first: a Sandbox's pass, before its own status write, waits
// for the claim writes of its Sandbox that are under way, those announced
// by its notice (readyNotices) and those being sent.
//
// It waits only when it is the one Sandbox pass running. With others
// running, more are likely queued behind them (a burst), and holding a
// worker would put off their starts, and so their claims, by more than
// the order gains. The wait is bounded (claimsFirstWait): a claim write
// slower than that has an API server too busy for the order to matter.
type claimWrites struct {
	mu sync.Mutex
	// pending are, by Sandbox, its claims whose status write is under way
	// or about to be, with when each was expected. An entry whose claim
	// pass never came (the claim was deleted) expires after bound.
	pending map[types.NamespacedName]map[types.NamespacedName]time.Time
	// wake is closed, and replaced, when an entry goes.
	wake chan struct{}
	// passes counts the Sandbox passes running.
	passes atomic.Int32
	// bound is how long a wait lasts at most, and an entry.
	bound time.Duration
}

// claimsFirstWait bounds how long a Sandbox's status write waits for its
// claims' writes.
const claimsFirstWait = 50 * time.Millisecond

func newClaimWrites() *claimWrites {
	return &claimWrites{pending: map[types.NamespacedName]map[types.NamespacedName]time.Time{}, wake: make(chan struct{}), bound: claimsFirstWait}
}

// expect records that claim's status write is on its way: the Sandbox's
// notice has sent it, or its pass is about to write.
func (w *claimWrites) expect(sandbox, claim types.NamespacedName) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.pending[sandbox]
	if m == nil {
		m = map[types.NamespacedName]time.Time{}
		w.pending[sandbox] = m
	}
	m[claim] = time.Now()
}

// done says claim's pass is over, written or not.
func (w *claimWrites) done(sandbox, claim types.NamespacedName) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.pending[sandbox]
	if _, ok := m[claim]; !ok {
		return
	}
	delete(m, claim)
	if len(m) == 0 {
		delete(w.pending, sandbox)
	}
	close(w.wake)
	w.wake = make(chan struct{})
}

// enter and leave bracket a Sandbox pass.
func (w *claimWrites) enter() {
	if w != nil {
		w.passes.Add(1)
	}
}

func (w *claimWrites) leave() {
	if w != nil {
		w.passes.Add(-1)
	}
}

// wait returns once sandbox has no claim write under way, at once when
// other Sandbox passes run, and after its bound at most.
func (w *claimWrites) wait(ctx context.Context, sandbox types.NamespacedName) {
	if w == nil || w.passes.Load() > 1 {
		return
	}
	deadline := time.Now().Add(w.bound)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		w.mu.Lock()
		wake, waiting := w.wake, w.waitingLocked(sandbox, time.Now())
		w.mu.Unlock()
		left := time.Until(deadline)
		if !waiting || left <= 0 {
			return
		}
		if timer == nil {
			timer = time.NewTimer(left)
		}
		select {
		case <-wake:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// waitingLocked says whether a claim write of sandbox is under way. It
// drops the entries that expired: sandbox's, and every Sandbox's once
// many are kept (those of Sandboxes that were deleted).
func (w *claimWrites) waitingLocked(sandbox types.NamespacedName, now time.Time) bool {
	if len(w.pending) > pendingSweep {
		for sb := range w.pending {
			w.expireLocked(sb, now)
		}
	}
	return w.expireLocked(sandbox, now)
}

// pendingSweep is how many Sandboxes with claim writes under way are kept
// before the expired entries of all are dropped.
const pendingSweep = 64

// expireLocked drops sandbox's expired entries and says whether any is
// left.
func (w *claimWrites) expireLocked(sandbox types.NamespacedName, now time.Time) bool {
	m := w.pending[sandbox]
	for claim, since := range m {
		if now.Sub(since) > w.bound {
			delete(m, claim)
		}
	}
	if len(m) == 0 {
		delete(w.pending, sandbox)
		return false
	}
	return true
}
