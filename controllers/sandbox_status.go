package controllers

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// The Sandbox's conditions are derived in one place: the phases of a
// reconcile record what they found in sandboxFacts, and sandboxConditions
// turns those facts into conditions. Nothing else sets a Sandbox
// condition, so what Ready says is read here, not traced through every
// branch of the reconcile.

// instanceRun is what the reconcile left the instance doing.
type instanceRun int

const (
	// The zero value: no phase got as far as deciding (a check stopped
	// the reconcile, or it failed before any phase spoke).
	_ instanceRun = iota
	// runForClaims: running for live claims.
	runForClaims
	// runKeepRunning: running without claims because keepRunning says so.
	runKeepRunning
	// runIdle: running without claims until stopAt.
	runIdle
	// runStopped: not running, nothing wants it.
	runStopped
	// runStoppedIdle: stopped by this reconcile once idle.
	runStoppedIdle
)

// problem is why the instance cannot be what the Sandbox asks: the reason
// is a condition reason of the API, the message says it to a user.
type problem struct {
	reason, message string
}

// enforcement is what SandboxEnforced says: only bwrap Sandboxes have one.
type enforcement int

const (
	enforcementUnknown enforcement = iota // not looked at in this reconcile
	enforcementNone                       // not a bwrap Sandbox
	enforcementOn                         // commands run inside bubblewrap
	enforcementOff                        // the insecure switch is set
)

// sandboxFacts is what one reconcile of a Sandbox found.
type sandboxFacts struct {
	generation int64
	instance   string
	live       int

	// problem, when set, is what stopped the reconcile: Ready and
	// RuntimeReady are False with its reason.
	problem *problem
	run     instanceRun
	// stopAt is when an idle instance stops (runIdle).
	stopAt time.Time
	// restartPending names a change that waits for the instance to be idle
	// (restartPolicy WhenIdle) while it serves claims.
	restartPending string

	enforcement enforcement
	// enforcementValue is the value of the insecure switch (set but not a
	// bypass value when enforcementOn).
	enforcementValue string

	// converged says the reconcile reached the instance's own state, so
	// overlay health and the worktrees' summary are current.
	converged bool
	overlay   *runtimes.Health
	// claims are the Sandbox's claims, for the summary of their worktrees.
	claims []v1alpha1.SessionClaim
	// usage is what the running instance uses; nil when it is stopped or
	// its runtime does not say.
	usage *runtimes.Usage
}

// fail records what stopped the reconcile.
func (f *sandboxFacts) fail(reason, message string) {
	f.problem = &problem{reason: reason, message: message}
}

// failErr records a runtime error with the reason it carries.
func (f *sandboxFacts) failErr(err error) {
	f.fail(instance.ErrorReason(err), err.Error())
}

// conditionChange is one condition to set, or to remove when remove is
// true.
type conditionChange struct {
	condition metav1.Condition
	remove    bool
}

// conditionChanges collects what a derivation decides, every condition
// stamped with the generation it was derived from.
type conditionChanges struct {
	generation int64
	list       []conditionChange
}

// set records a condition. Its message is cut at maxConditionMessage:
// messages quote what agents, git and runtimes say (paths of the agent's
// making, a lock reason, an error naming a file in the agent's areas) and
// what a tenant's spec holds.
func (c *conditionChanges) set(typ string, ok bool, reason, msg string) {
	c.setWithin(typ, ok, reason, msg, maxConditionMessage)
}

// setWithin is set with a bound of the caller's: the Sandbox's GitHealthy
// lists claims' messages within maxGitSummary.
func (c *conditionChanges) setWithin(typ string, ok bool, reason, msg string, bound int) {
	msg = boundedbuf.Cut(msg, bound)
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	c.list = append(c.list, conditionChange{condition: metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: c.generation}})
}

func (c *conditionChanges) remove(typ string) {
	c.list = append(c.list, conditionChange{condition: metav1.Condition{Type: typ}, remove: true})
}

// sandboxConditions computes the Sandbox's conditions from the facts. A
// condition the facts say nothing about is left out, so it keeps what an
// earlier reconcile said.
func sandboxConditions(f sandboxFacts) []conditionChange {
	changes := &conditionChanges{generation: f.generation}
	set, remove := changes.set, changes.remove

	switch f.enforcement {
	case enforcementNone:
		remove(v1alpha1.ConditionSandboxEnforced)
	case enforcementOn:
		msg := "commands run inside bubblewrap"
		if f.enforcementValue != "" {
			msg = fmt.Sprintf("commands run inside bubblewrap (%s is set to %q, which is not a bypass value, so it is ignored)", policy.DisableSandboxEnv, f.enforcementValue)
		}
		set(v1alpha1.ConditionSandboxEnforced, true, v1alpha1.ReasonEnforced, msg)
	case enforcementOff:
		set(v1alpha1.ConditionSandboxEnforced, false, v1alpha1.ReasonSandboxDisabled, enforcementOffMessage(f.enforcementValue))
	}

	runtimeReady, ready, reason, msg, readyReason, readyMsg := false, false, "", "", "", ""
	switch {
	case f.problem != nil:
		reason, msg = f.problem.reason, f.problem.message
	case f.run == runForClaims && f.restartPending != "":
		reason = v1alpha1.ReasonRestartRequired
		msg = fmt.Sprintf("instance %s must restart to apply %s; it restarts when no claim holds it (restartPolicy WhenIdle)", f.instance, f.restartPending)
		ready, readyReason = true, v1alpha1.ReasonRunning
		readyMsg = fmt.Sprintf("instance %s is running for %d claim(s); a restart is pending", f.instance, f.live)
	case f.run == runForClaims:
		runtimeReady, ready, reason = true, true, v1alpha1.ReasonRunning
		msg = fmt.Sprintf("instance %s is running for %d claim(s)", f.instance, f.live)
	case f.run == runKeepRunning:
		runtimeReady, ready, reason = true, true, v1alpha1.ReasonIdle
		msg = fmt.Sprintf("no claims: instance %s keeps running (keepRunning)", f.instance)
	case f.run == runIdle:
		runtimeReady, ready, reason = true, true, v1alpha1.ReasonIdle
		msg = fmt.Sprintf("no claims: instance %s stops at %s unless a SessionClaim binds", f.instance, f.stopAt.UTC().Format(time.RFC3339))
	case f.run == runStopped:
		runtimeReady, reason = true, v1alpha1.ReasonStopped
		msg = fmt.Sprintf("no claims: instance %s starts when a SessionClaim binds", f.instance)
	case f.run == runStoppedIdle:
		runtimeReady, reason = true, v1alpha1.ReasonStopped
		msg = fmt.Sprintf("no claims: instance %s stopped; it starts when a SessionClaim binds", f.instance)
	}
	if reason != "" {
		if readyReason == "" {
			readyReason, readyMsg = reason, msg
		}
		set(v1alpha1.ConditionRuntimeReady, runtimeReady, reason, msg)
		set(v1alpha1.ConditionReady, ready, readyReason, readyMsg)
	}

	if f.converged {
		if h := f.overlay; h == nil {
			remove(v1alpha1.ConditionOverlayHealthy)
		} else {
			set(v1alpha1.ConditionOverlayHealthy, h.Healthy, instance.Reason(h.Reason), h.Message)
		}
		switch u := f.usage; {
		case u == nil:
			remove(v1alpha1.ConditionWithinLimits)
		case u.OOMKills > 0:
			set(v1alpha1.ConditionWithinLimits, false, v1alpha1.ReasonOOMKilled, fmt.Sprintf(
				"%d process(es) were killed at the memory limit since instance %s started; raise spec.resources.limits.memory or use less", u.OOMKills, f.instance))
		case u.PidsLimited > 0:
			set(v1alpha1.ConditionWithinLimits, false, v1alpha1.ReasonPidsLimitReached, fmt.Sprintf(
				"%d fork(s) were refused at the pids limit since instance %s started; raise spec.resources.pidsLimit or start fewer processes", u.PidsLimited, f.instance))
		default:
			set(v1alpha1.ConditionWithinLimits, true, v1alpha1.ReasonWithinLimits, fmt.Sprintf("no command of instance %s hit a resource limit since it started", f.instance))
		}
		if g := gitSummary(f.claims); g == nil {
			remove(v1alpha1.ConditionGitHealthy)
		} else {
			changes.setWithin(v1alpha1.ConditionGitHealthy, g.healthy, g.reason, g.message, maxGitSummary+maxConditionMessage)
		}
	}
	return changes.list
}

// enforcementOffMessage is what SandboxEnforced says, and the Warning
// Event repeats, when the insecure switch is set.
func enforcementOffMessage(value string) string {
	return fmt.Sprintf("INSECURE: the controller runs with %s=%s, so this Sandbox's commands run directly on the host with the controller's privileges", policy.DisableSandboxEnv, value)
}

// applyConditions writes the changes into conds; a condition's transition
// time moves only when its status changes, so repeating a reconcile
// writes nothing new.
func applyConditions(conds *[]metav1.Condition, changes []conditionChange) {
	for _, c := range changes {
		if c.remove {
			meta.RemoveStatusCondition(conds, c.condition.Type)
			continue
		}
		meta.SetStatusCondition(conds, c.condition)
	}
}

// placement is what the placer decided for a Sandbox that no live node
// runs.
type placement int

const (
	// placedOn: given the node.
	placedOn placement = iota + 1
	// unschedulable: no node can take it now.
	unschedulable
	// movedOff: its node is lost and it moved to the node.
	movedOff
	// stranded: its node is lost and no other node can take it.
	stranded
	// staysOn: its node is lost and it stays there (onNodeLost: Stay, or
	// spec.nodeName pins it).
	staysOn
	// evicting: its node is lost and its Pod is evicted after evictAfter
	// (onNodeLost: Move).
	evicting
)

// placementFacts is what one pass of the placer found of a Sandbox.
type placementFacts struct {
	generation int64
	outcome    placement
	// node is where it is placed (placedOn, movedOff).
	node string
	// lost is the node it was on, lostMsg since when and why it is lost.
	lost, lostMsg string
	// why no node can take it (unschedulable, stranded), and the reason
	// (unschedulable: Unschedulable or PodRefused).
	why, reason string
	// evictAfter is how long the Pod tolerates the loss (evicting).
	evictAfter time.Duration
	// pinned says spec.nodeName holds it on its lost node (staysOn).
	pinned bool
}

// placementConditions computes the Ready condition the placer reports
// while no node's controller runs the Sandbox; that node's controller
// derives it again (sandboxConditions) once it does.
func placementConditions(f placementFacts) []conditionChange {
	changes := &conditionChanges{generation: f.generation}
	notReady := func(reason, msg string) {
		changes.set(v1alpha1.ConditionReady, false, reason, boundedMessage(msg))
	}
	switch f.outcome {
	case placedOn:
		notReady(v1alpha1.ReasonPlaced, fmt.Sprintf("placed on node %s; waiting for its controller", f.node))
	case unschedulable:
		reason := f.reason
		if reason == "" {
			reason = v1alpha1.ReasonUnschedulable
		}
		notReady(reason, "no node runs this Sandbox yet: "+f.why)
	case movedOff:
		notReady(v1alpha1.ReasonNodeLost, fmt.Sprintf(
			"%s; moved to node %s (onNodeLost: Move): the agent's areas on %s stay there, and on %s it starts with the areas %s has", f.lostMsg, f.node, f.lost, f.node, f.node))
	case stranded:
		notReady(v1alpha1.ReasonNodeLost, f.lostMsg+"; no other node can take it: "+f.why)
	case evicting:
		notReady(v1alpha1.ReasonNodeLost, fmt.Sprintf("%s; its Pod is evicted %s after the node's loss and a new one is scheduled on another node (onNodeLost: Move)", f.lostMsg, f.evictAfter))
	case staysOn:
		stay := "it stays (onNodeLost: Stay) and runs again when the node is back"
		if f.pinned {
			stay = "it stays: spec.nodeName pins it there"
		}
		notReady(v1alpha1.ReasonNodeLost, f.lostMsg+"; "+stay)
	}
	return changes.list
}
