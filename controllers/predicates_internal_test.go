package controllers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// A Sandbox hears of a claim's worktree only what it binds or summarises.
func TestClaimChangesForSandbox(t *testing.T) {
	wt := func(dir string, relative, checkedOut bool) *v1alpha1.SessionClaim {
		c := &v1alpha1.SessionClaim{}
		if dir != "" {
			c.Status.Worktree = &v1alpha1.WorktreeStatus{GitCommonDir: dir, RelativePaths: relative, CheckedOut: checkedOut, Head: "abc"}
		}
		return c
	}
	healthy := wt("/r/.git", false, true)
	healthy.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionGitHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonHealthy}}
	for _, tc := range []struct {
		name     string
		old, new *v1alpha1.SessionClaim
		want     bool
	}{
		{"worktree added", wt("", false, false), wt("/r/.git", false, false), true},
		{"worktree added with relative links", wt("", false, false), wt("/r/.git", true, false), false},
		{"checked out", wt("/r/.git", false, false), wt("/r/.git", false, true), false},
		{"git healthy", wt("/r/.git", false, true), healthy, true},
		{"nothing", wt("/r/.git", false, true), wt("/r/.git", false, true), false},
	} {
		got := claimChangesForSandbox.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new})
		if got != tc.want {
			t.Errorf("%s: the Sandbox hears %v, want %v", tc.name, got, tc.want)
		}
	}
}

// queued records what a handler enqueues, and how soon.
type queued struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	now, later []string
}

func (q *queued) Add(r reconcile.Request) { q.now = append(q.now, r.Name) }
func (q *queued) AddAfter(r reconcile.Request, d time.Duration) {
	if d <= 0 {
		q.Add(r)
		return
	}
	q.later = append(q.later, r.Name)
}

// A running Sandbox counts a claim that came or went a moment later, and
// a burst of them once; a stopped one starts for it at once, and a
// worktree's git directory is never left waiting.
func TestClaimsOfSandboxDelaysOnlyACount(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	running := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "running"}}
	running.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunning}}
	stopped := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "stopped"}}
	stopped.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonStopped}}
	h := &claimsOfSandbox{reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(running, stopped).Build()}
	claim := func(sandbox, gitDir string) *v1alpha1.SessionClaim {
		c := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Spec: v1alpha1.SessionClaimSpec{SandboxName: sandbox}}
		if gitDir != "" {
			c.Status.Worktree = &v1alpha1.WorktreeStatus{GitCommonDir: gitDir}
		}
		return c
	}
	deleting := func(c *v1alpha1.SessionClaim) *v1alpha1.SessionClaim {
		c = c.DeepCopy()
		c.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		return c
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		send  func(*queued)
		later bool
	}{
		{"created on a running Sandbox", func(q *queued) {
			h.Create(ctx, event.CreateEvent{Object: claim("running", "")}, q)
		}, true},
		{"deleted from a running Sandbox", func(q *queued) {
			h.Delete(ctx, event.DeleteEvent{Object: claim("running", "")}, q)
		}, true},
		{"created on a stopped Sandbox", func(q *queued) {
			h.Create(ctx, event.CreateEvent{Object: claim("stopped", "")}, q)
		}, false},
		{"created on a Sandbox not in the cache", func(q *queued) {
			h.Create(ctx, event.CreateEvent{Object: claim("unknown", "")}, q)
		}, false},
		{"a worktree to mount on a running Sandbox", func(q *queued) {
			h.Update(ctx, event.UpdateEvent{ObjectOld: claim("running", ""), ObjectNew: claim("running", "/r/.git")}, q)
		}, false},
		{"a claim with a worktree deleted", func(q *queued) {
			c := claim("running", "/r/.git")
			h.Update(ctx, event.UpdateEvent{ObjectOld: c, ObjectNew: deleting(c)}, q)
		}, false},
		{"a claim without one deleted", func(q *queued) {
			c := claim("running", "")
			h.Update(ctx, event.UpdateEvent{ObjectOld: c, ObjectNew: deleting(c)}, q)
		}, true},
		{"a generic event", func(q *queued) {
			h.Generic(ctx, event.GenericEvent{Object: claim("running", "")}, q)
		}, false},
	} {
		q := &queued{}
		tc.send(q)
		if got := len(q.later) == 1 && len(q.now) == 0; got != tc.later || len(q.now)+len(q.later) != 1 {
			t.Errorf("%s: enqueued at once %v, later %v; want later: %v", tc.name, q.now, q.later, tc.later)
		}
	}
}
