package controllers

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// A Sandbox's status changes with every claim it counts; its claims need
// to hear only of what they report or act on. Without this filter a burst
// of n claims on one Sandbox costs n² claim reconciles.
var sandboxChangesForClaims = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*v1alpha1.Sandbox), e.ObjectNew.(*v1alpha1.Sandbox)
		return claimView(o) != claimView(n) || !slices.Equal(o.Status.MountedGitDirs, n.Status.MountedGitDirs)
	},
}

// sandboxForClaims is what of a Sandbox its claims act on or report.
type sandboxForClaims struct {
	deleting       bool
	agent, node    string
	ready          bool
	reason, notice string
}

func claimView(sb *v1alpha1.Sandbox) sandboxForClaims {
	v := sandboxForClaims{deleting: !sb.DeletionTimestamp.IsZero(), agent: sb.Spec.Agent, node: sb.Node()}
	if c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		v.ready = c.Status == "True"
		if !v.ready {
			// A claim that is not Ready repeats why.
			v.reason, v.notice = c.Reason, c.Message
		}
	}
	return v
}

// A claim's status changes as it binds and as its Sandbox changes; the
// Sandbox needs to hear only of what it counts or summarises.
var claimChangesForSandbox = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*v1alpha1.SessionClaim), e.ObjectNew.(*v1alpha1.SessionClaim)
		return o.Generation != n.Generation ||
			o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
			gitDirOf(o) != gitDirOf(n) ||
			!sameCondition(o.Status.Conditions, n.Status.Conditions, v1alpha1.ConditionGitHealthy)
	},
}

// sameCondition says whether two lists hold the same condition of a type
// (or both none).
func sameCondition(a, b []metav1.Condition, typ string) bool {
	return equality.Semantic.DeepEqual(meta.FindStatusCondition(a, typ), meta.FindStatusCondition(b, typ))
}

// gitDirOf is what of a claim's worktree its Sandbox binds
// (sandbox_worktrees.go); its head, checkout and the rest are the claim's.
func gitDirOf(c *v1alpha1.SessionClaim) string {
	if c.Status.Worktree == nil || c.Status.Worktree.RelativePaths {
		return ""
	}
	return c.Status.Worktree.GitCommonDir
}
