package controllers

import (
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// A cold claim waits for its Sandbox to start, and its Ready used to wait
// for the Sandbox's status write to come back through the watch: the
// Sandbox's write and then the claim's, one after the other. readyNotices
// carries a Sandbox's Ready turning True from the pass that started it to
// its claims directly, so that the claim's write goes beside the
// Sandbox's. The instance runs when the notice is given; only the
// Sandbox's status is still on its way.
//
// A notice holds only while this process's cache still shows the Sandbox
// as the pass found it (by resourceVersion): once the cache has anything
// newer, that is the truth and the notice is dropped. A failed status
// write withdraws it. Claims with a worktree do not use notices: their
// handshake reads the Sandbox's mounted git directories, which only the
// stored status has.
type readyNotices struct {
	mu    sync.Mutex
	byUID map[types.UID]readyNotice
	// claims brings the claims of a Sandbox that turned Ready to the claim
	// controller (a channel source); a full channel drops the event, and
	// the watch brings the claim a moment later.
	claims chan event.GenericEvent
	// writes learns of the claim writes a notice sets off, which the
	// Sandbox's own write waits for (claimWrites); nil: none.
	writes *claimWrites
}

// readyNotice is a Sandbox's Ready condition not yet in the cache.
type readyNotice struct {
	// versions are the Sandbox's resourceVersions the pass started from:
	// as the cache gave it and, after a finalizer patch, as read back.
	versions [2]string
	ready    metav1.Condition
}

// noticeBuffer bounds the claims waiting to be enqueued.
const noticeBuffer = 1024

func newReadyNotices() *readyNotices {
	return &readyNotices{byUID: map[types.UID]readyNotice{}, claims: make(chan event.GenericEvent, noticeBuffer)}
}

// announce is called by a Sandbox's pass before its status write, with
// the versions it started from and the status it is about to write. When
// Ready turns True, the notice is kept and the claims that wait for it are
// sent to the claim controller; any other pass replaces no notice but
// drops one of its own Sandbox that the cache has passed.
func (n *readyNotices) announce(versions [2]string, read, sb *v1alpha1.Sandbox, claims []v1alpha1.SessionClaim) {
	if n == nil {
		return
	}
	now, was := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady), findCondition(read.Status.Conditions, v1alpha1.ConditionReady)
	if now == nil || now.Status != metav1.ConditionTrue || (was != nil && was.Status == metav1.ConditionTrue) {
		n.mu.Lock()
		if old, ok := n.byUID[sb.UID]; ok && !old.holds(versions[0]) && !old.holds(versions[1]) {
			delete(n.byUID, sb.UID)
		}
		n.mu.Unlock()
		return
	}
	n.mu.Lock()
	n.byUID[sb.UID] = readyNotice{versions: versions, ready: *now}
	n.mu.Unlock()
	for i := range claims {
		c := &claims[i]
		if !c.DeletionTimestamp.IsZero() || c.Spec.Worktree != nil {
			continue
		}
		if r := findCondition(c.Status.Conditions, v1alpha1.ConditionReady); r != nil && r.Status == metav1.ConditionTrue {
			continue
		}
		// Expected before it is sent: its pass may be over before this
		// goes on.
		key := client.ObjectKeyFromObject(c)
		n.writes.expect(client.ObjectKeyFromObject(sb), key)
		select {
		case n.claims <- event.GenericEvent{Object: c.DeepCopy()}:
		default:
			n.writes.done(client.ObjectKeyFromObject(sb), key)
		}
	}
}

// withdraw drops the Sandbox's notice: its status write failed.
func (n *readyNotices) withdraw(sb *v1alpha1.Sandbox) {
	if n == nil {
		return
	}
	n.mu.Lock()
	delete(n.byUID, sb.UID)
	n.mu.Unlock()
}

// readyOf is the Sandbox's Ready condition (nil before it has one): the
// notice's while the cached sb is still the one its pass started from,
// else the cached one. A notice the cache has passed is dropped.
func (n *readyNotices) readyOf(sb *v1alpha1.Sandbox) *metav1.Condition {
	if n != nil {
		n.mu.Lock()
		notice, ok := n.byUID[sb.UID]
		switch {
		case ok && notice.holds(sb.ResourceVersion):
			n.mu.Unlock()
			c := notice.ready
			return &c
		case ok:
			delete(n.byUID, sb.UID)
		}
		n.mu.Unlock()
	}
	return sandboxReadyCondition(sb)
}

func (n readyNotice) holds(version string) bool {
	return version != "" && (n.versions[0] == version || n.versions[1] == version)
}

// ownWrites remembers, for each object this process has just written
// (a claim's status; a Sandbox's finalizer and status), the
// resourceVersion its write was computed from and the one it stored.
//
// A pass that reads the version a write was computed from again reads
// from a cache that has not seen the write yet: it would derive the same
// status and send it again (stale). With notices this is common: the
// Sandbox's status write comes back right after the claim's own write and
// brings the claim back before its cache has that write.
//
// And the watch event of the write itself, from the version read to the
// version stored, tells the reconciler nothing it does not know: the pass
// that wrote derived its status from everything the object said before,
// and the write changed nothing else. Such an event starts no pass
// (echoes). Without the filter every Sandbox and every claim made one pass
// more after each of its writes, each reading its runtime (the instance's
// record, tree and usage) or its Sandbox again to find nothing to do.
type ownWrites struct {
	mu   sync.Mutex
	from map[types.UID]ownWrite
	// sweepAt is the size at which records older than ownWriteAge go: a
	// claim deleted right after a write is never read again to drop its
	// record.
	sweepAt int
}

// ownWrite is an object's last write, and the write of the same pass
// before it (a Sandbox's finalizer, then its status), whose event may come
// after the last one is recorded.
type ownWrite struct {
	version, stored        string
	earlier, earlierStored string
	at                     time.Time
}

// ownWriteAge is how long a record is kept at most: a cache is never
// that far behind.
const ownWriteAge = time.Minute

// staleRetry is when a pass that found its cache behind its own write
// looks again; the watch event of that write usually comes first.
const staleRetry = 50 * time.Millisecond

// stale says the cached o is a version an earlier write of this process
// was computed from; a newer one drops the record.
func (w *ownWrites) stale(o client.Object) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.from[o.GetUID()]
	if v := o.GetResourceVersion(); ok && (r.version == v || (r.earlier != "" && r.earlier == v)) {
		return true
	}
	delete(w.from, o.GetUID())
	return false
}

// wrote records a write computed from read that stored after; nothing
// when no write happened. A write computed from what the object's last
// recorded write stored is that one's follower in the same pass: both are
// kept.
func (w *ownWrites) wrote(read, after client.Object) {
	if read.GetResourceVersion() == after.GetResourceVersion() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.from == nil {
		w.from = map[types.UID]ownWrite{}
	}
	now := time.Now()
	if len(w.from) >= max(w.sweepAt, 1024) {
		for uid, r := range w.from {
			if now.Sub(r.at) > ownWriteAge {
				delete(w.from, uid)
			}
		}
		w.sweepAt = 2 * len(w.from)
	}
	rec := ownWrite{version: read.GetResourceVersion(), stored: after.GetResourceVersion(), at: now}
	if prev, ok := w.from[after.GetUID()]; ok && prev.stored == rec.version {
		rec.earlier, rec.earlierStored = prev.version, prev.stored
	}
	w.from[after.GetUID()] = rec
}

// echo says whether an update from before to after is one of this
// process's recorded writes coming back through the watch, and nothing
// else. The last write's event drops the record: the cache has it now.
func (w *ownWrites) echo(before, after client.Object) bool {
	if before == nil || after == nil || before.GetUID() != after.GetUID() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.from[after.GetUID()]
	if !ok {
		return false
	}
	from, to := before.GetResourceVersion(), after.GetResourceVersion()
	switch {
	case from == r.version && to == r.stored:
		delete(w.from, after.GetUID())
		return true
	case r.earlier != "" && from == r.earlier && to == r.earlierStored:
		return true
	}
	return false
}

// echoes filters out the watch events of this process's own writes
// (ownWrites.echo); every other event passes.
func (w *ownWrites) echoes() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !w.echo(e.ObjectOld, e.ObjectNew)
	}}
}
