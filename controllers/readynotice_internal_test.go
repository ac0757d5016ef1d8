package controllers

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

func noticeSandbox(version string, ready metav1.ConditionStatus, reason string) *v1alpha1.Sandbox {
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "sb", UID: "uid-1", ResourceVersion: version}}
	if ready != "" {
		sb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: ready, Reason: reason}}
	}
	return sb
}

func noticeClaim(name string, ready bool, worktree, deleting bool) v1alpha1.SessionClaim {
	c := v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}, Spec: v1alpha1.SessionClaimSpec{SandboxName: "sb"}}
	if ready {
		c.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSandboxReady}}
	}
	if worktree {
		c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "repo"}
	}
	if deleting {
		now := metav1.Now()
		c.DeletionTimestamp = &now
	}
	return c
}

func TestReadyNotices(t *testing.T) {
	n := newReadyNotices()
	read := noticeSandbox("7", metav1.ConditionFalse, v1alpha1.ReasonStopped)
	started := noticeSandbox("7", metav1.ConditionTrue, v1alpha1.ReasonRunning)
	claims := []v1alpha1.SessionClaim{
		noticeClaim("waiting", false, false, false),
		noticeClaim("ready-already", true, false, false),
		noticeClaim("worktree", false, true, false),
		noticeClaim("going", false, false, true),
	}
	n.announce([2]string{"6", "7"}, read, started, claims)

	if got := len(n.claims); got != 1 {
		t.Fatalf("claims sent: got %d, want only the one waiting without a worktree", got)
	}
	if ev := <-n.claims; ev.Object.GetName() != "waiting" {
		t.Errorf("sent claim %q, want waiting", ev.Object.GetName())
	}
	for _, v := range []string{"6", "7"} {
		if c := n.readyOf(noticeSandbox(v, metav1.ConditionFalse, v1alpha1.ReasonStopped)); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("cache at version %s, from before the write: got %v, want the notice's Ready", v, c)
		}
	}
	// The cache has the write: it is the truth, and the notice goes.
	if c := n.readyOf(noticeSandbox("8", metav1.ConditionFalse, "Failed")); c == nil || c.Reason != "Failed" {
		t.Errorf("cache past the notice: got %v, want the cached condition", c)
	}
	if c := n.readyOf(noticeSandbox("7", metav1.ConditionFalse, v1alpha1.ReasonStopped)); c.Status != metav1.ConditionFalse {
		t.Errorf("a notice the cache passed came back: %v", c)
	}

	// A failed write withdraws its notice.
	n.announce([2]string{"9", "9"}, read, started, nil)
	n.withdraw(started)
	if c := n.readyOf(noticeSandbox("9", metav1.ConditionFalse, v1alpha1.ReasonStopped)); c.Status != metav1.ConditionFalse {
		t.Errorf("withdrawn notice used: %v", c)
	}

	// A pass that does not turn Ready keeps a notice the cache has not
	// passed, and drops one it has.
	n.announce([2]string{"10", "10"}, read, started, nil)
	n.announce([2]string{"10", "10"}, started, started, nil)
	if c := n.readyOf(noticeSandbox("10", metav1.ConditionFalse, v1alpha1.ReasonStopped)); c.Status != metav1.ConditionTrue {
		t.Errorf("a later pass from the same version dropped the notice: %v", c)
	}
	n.announce([2]string{"11", "11"}, started, started, nil)
	if _, ok := n.byUID[started.UID]; ok {
		t.Error("a pass from a newer version kept the older notice")
	}

	// A full channel drops the event rather than block the Sandbox's pass.
	for range noticeBuffer + 5 {
		n.announce([2]string{"12", "12"}, read, started, claims[:1])
	}
	if got := len(n.claims); got != noticeBuffer {
		t.Errorf("channel holds %d, want %d", got, noticeBuffer)
	}

	var none *readyNotices
	none.announce([2]string{"1", "1"}, read, started, claims)
	if c := none.readyOf(read); c.Status != metav1.ConditionFalse {
		t.Errorf("no notices: got %v, want the cached condition", c)
	}
}

func TestOwnWritesTellAStaleCache(t *testing.T) {
	var w ownWrites
	claim := func(version string) *v1alpha1.SessionClaim {
		return &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", UID: "uid-c", ResourceVersion: version}}
	}
	w.wrote(claim("3"), claim("3"))
	if w.stale(claim("3")) {
		t.Fatal("a pass that wrote nothing made its version stale")
	}
	w.wrote(claim("3"), claim("4"))
	if !w.stale(claim("3")) {
		t.Error("the version a write was computed from, read again, is not stale")
	}
	if w.stale(claim("4")) {
		t.Error("the written version is stale")
	}
	if w.stale(claim("3")) {
		t.Error("once the cache had the write, the record stayed")
	}

	// Claims deleted right after a write are never read again: their
	// records go once old, when the map has grown.
	for i := range 1024 {
		w.wrote(&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(fmt.Sprint("gone-", i)), ResourceVersion: "1"}},
			&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "2", UID: types.UID(fmt.Sprint("gone-", i))}})
	}
	for uid, r := range w.from {
		r.at = r.at.Add(-2 * ownWriteAge)
		w.from[uid] = r
	}
	w.wrote(claim("5"), claim("6"))
	if len(w.from) != 1 {
		t.Errorf("after a sweep %d records are left, want the newest only", len(w.from))
	}
}

// The watch event of a write of this process, and only that event, starts
// no pass: a Sandbox's finalizer then its status in one pass, each event
// in its turn; an event from a version the pass did not read (another
// writer came between) and a later change on top of ours pass through.
func TestOwnWritesFilterTheirOwnEchoes(t *testing.T) {
	var w ownWrites
	sb := func(version string) *v1alpha1.Sandbox {
		return &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "sb", UID: "uid-sb", ResourceVersion: version}}
	}
	echo := func(from, to string) bool {
		return !w.echoes().Update(event.UpdateEvent{ObjectOld: sb(from), ObjectNew: sb(to)})
	}
	if echo("1", "2") {
		t.Fatal("an update this process did not write was taken for its own")
	}
	// The finalizer (1 to 2), then the status (2 to 3), in one pass.
	w.wrote(sb("1"), sb("2"))
	w.wrote(sb("2"), sb("3"))
	if echo("1", "3") {
		t.Error("an event spanning both writes, with whatever came between, was filtered")
	}
	if !echo("1", "2") {
		t.Error("the finalizer write's own event started a pass")
	}
	if !echo("2", "3") {
		t.Error("the status write's own event started a pass")
	}
	if echo("2", "3") {
		t.Error("the record outlived the last write's event: a later identical event would be lost")
	}

	// Another writer came between the read and the write: the event runs
	// from its version, and the pass must see what it did.
	w.wrote(sb("5"), sb("7"))
	if echo("6", "7") {
		t.Error("an event from another writer's version was filtered")
	}
	// A change on top of ours passes.
	if echo("7", "8") {
		t.Error("a change after this process's write was filtered")
	}
	// A create, a delete and a generic event always pass.
	p := w.echoes()
	if !p.Create(event.CreateEvent{Object: sb("9")}) || !p.Delete(event.DeleteEvent{Object: sb("9")}) || !p.Generic(event.GenericEvent{Object: sb("9")}) {
		t.Error("the filter dropped an event that is not an update")
	}
}
