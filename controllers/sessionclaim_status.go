package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// A claim's conditions are derived in one place, as a Sandbox's are: the
// reconcile records what it found in claimFacts and claimConditions turns
// that into Bound, Ready, WorktreeReady and GitHealthy.

// binding is how a claim stands with its Sandbox.
type binding int

const (
	bindingUnknown binding = iota // the reconcile did not get as far
	bindingNoSandbox
	bindingSandboxDeleting
	// bindingConflict: the Sandbox does not own its agent.
	bindingConflict
	bindingBound
	// bindingNoNode: the Sandbox has no live node (not placed, or its node
	// is lost), so no node's controller binds the claim; the coordinator
	// says so in Ready and leaves the rest as that node last wrote it.
	bindingNoNode
)

// worktreeStage is how far the claim's worktree got.
type worktreeStage int

const (
	worktreeUnknown worktreeStage = iota // not looked at in this reconcile
	worktreeNone                         // the claim asks for no worktree
	worktreeFailed                       // adding or checking it out failed
	worktreeWaiting                      // added; waits for the Sandbox
	worktreeCheckedOut
)

// claimFacts is what one reconcile of a claim found.
type claimFacts struct {
	generation int64
	sandbox    string
	namespace  string
	instance   string

	binding  binding
	conflict string
	// sandboxReady is the Sandbox's Ready condition (nil before it has one).
	sandboxReady *metav1.Condition

	worktree worktreeStage
	// worktreeProblem is why adding or checking out failed (worktreeFailed).
	worktreeProblem problem
	// worktreeMessage describes a waiting or checked-out worktree.
	worktreeMessage string
	// git is the health check of a checked-out worktree.
	git gitHealth
}

// claimConditions computes the claim's conditions from the facts; a
// condition the facts say nothing about is left out.
func claimConditions(f claimFacts) []conditionChange {
	changes := &conditionChanges{generation: f.generation}
	set, remove := changes.set, changes.remove
	notBound := func(reason, msg string) {
		set(v1alpha1.ConditionBound, false, reason, msg)
		set(v1alpha1.ConditionReady, false, reason, msg)
	}

	switch f.binding {
	case bindingNoSandbox:
		notBound(v1alpha1.ReasonSandboxNotFound, fmt.Sprintf("Sandbox %q does not exist in namespace %q; the claim binds when it is created", f.sandbox, f.namespace))
	case bindingSandboxDeleting:
		notBound(v1alpha1.ReasonSandboxDeleting, fmt.Sprintf("Sandbox %q is being deleted", f.sandbox))
	case bindingConflict:
		notBound(v1alpha1.ReasonNameConflict, fmt.Sprintf("Sandbox %q does not own its agent: %s", f.sandbox, f.conflict))
	case bindingNoNode:
		set(v1alpha1.ConditionReady, false, v1alpha1.ReasonSandboxNotReady, sandboxNotReadyMessage(f.sandbox, f.sandboxReady))
	case bindingBound:
		set(v1alpha1.ConditionBound, true, v1alpha1.ReasonBound, fmt.Sprintf("bound to Sandbox %q", f.sandbox))
		switch c := f.sandboxReady; {
		case c != nil && c.Status == metav1.ConditionTrue:
			set(v1alpha1.ConditionReady, true, v1alpha1.ReasonSandboxReady, fmt.Sprintf("instance %s is running", f.instance))
		default:
			set(v1alpha1.ConditionReady, false, v1alpha1.ReasonSandboxNotReady, sandboxNotReadyMessage(f.sandbox, c))
		}
	}

	switch f.worktree {
	case worktreeNone:
		remove(v1alpha1.ConditionWorktreeReady)
		remove(v1alpha1.ConditionGitHealthy)
	case worktreeFailed:
		p := f.worktreeProblem
		set(v1alpha1.ConditionWorktreeReady, false, p.reason, p.message)
		set(v1alpha1.ConditionGitHealthy, false, p.reason, "no worktree: "+p.message)
	case worktreeWaiting:
		set(v1alpha1.ConditionWorktreeReady, false, v1alpha1.ReasonWaitingForSandbox, f.worktreeMessage)
		set(v1alpha1.ConditionGitHealthy, false, v1alpha1.ReasonWaitingForSandbox, f.worktreeMessage)
	case worktreeCheckedOut:
		set(v1alpha1.ConditionWorktreeReady, true, v1alpha1.ReasonWorktreeCreated, f.worktreeMessage)
		set(v1alpha1.ConditionGitHealthy, f.git.healthy, f.git.reason, f.git.message)
	}
	return changes.list
}

// sandboxNotReadyMessage is a claim's Ready message when its Sandbox's
// Ready condition (nil: none yet) is not True.
func sandboxNotReadyMessage(sandbox string, c *metav1.Condition) string {
	if c == nil {
		return fmt.Sprintf("Sandbox %q is not ready yet", sandbox)
	}
	return fmt.Sprintf("Sandbox %q is not ready: %s: %s", sandbox, c.Reason, c.Message)
}

// sandboxReadyCondition is the Sandbox's Ready condition, copied.
func sandboxReadyCondition(sb *v1alpha1.Sandbox) *metav1.Condition {
	if c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		cc := *c
		return &cc
	}
	return nil
}
