package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

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
