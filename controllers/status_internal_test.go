package controllers

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// want is one expected condition: its status, reason and a piece of its
// message; gone means the condition is removed.
type want struct {
	status  metav1.ConditionStatus
	reason  string
	message string
	gone    bool
}

func checkConditions(t *testing.T, got []conditionChange, gen int64, expect map[string]want) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range got {
		typ := c.condition.Type
		if seen[typ] {
			t.Errorf("condition %s derived twice", typ)
		}
		seen[typ] = true
		w, ok := expect[typ]
		if !ok {
			t.Errorf("condition %s derived (%+v) but the facts say nothing about it", typ, c)
			continue
		}
		if w.gone != c.remove {
			t.Errorf("condition %s: removed %v, want %v", typ, c.remove, w.gone)
			continue
		}
		if c.remove {
			continue
		}
		if c.condition.Status != w.status || c.condition.Reason != w.reason || !strings.Contains(c.condition.Message, w.message) {
			t.Errorf("condition %s = %s/%s %q, want %s/%s containing %q", typ, c.condition.Status, c.condition.Reason, c.condition.Message, w.status, w.reason, w.message)
		}
		if c.condition.ObservedGeneration != gen {
			t.Errorf("condition %s: observedGeneration %d, want %d", typ, c.condition.ObservedGeneration, gen)
		}
	}
	for typ := range expect {
		if !seen[typ] {
			t.Errorf("condition %s not derived", typ)
		}
	}
}

func TestSandboxConditions(t *testing.T) {
	const gen = 7
	T, F := metav1.ConditionTrue, metav1.ConditionFalse
	stopAt := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	worktreeClaim := func(name string, healthy bool, reason string) v1alpha1.SessionClaim {
		c := v1alpha1.SessionClaim{}
		c.Name = name
		c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "/workspace/repo"}
		status := metav1.ConditionFalse
		if healthy {
			status = metav1.ConditionTrue
		}
		c.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionGitHealthy, Status: status, Reason: reason, Message: "m-" + name}}
		return c
	}
	deleting := worktreeClaim("gone", false, "Broken")
	deleting.DeletionTimestamp = &metav1.Time{Time: stopAt}

	for _, tc := range []struct {
		name   string
		facts  sandboxFacts
		expect map[string]want
	}{
		{
			name:   "nothing decided leaves every condition as it was",
			facts:  sandboxFacts{},
			expect: map[string]want{},
		},
		{
			name:  "a problem makes Ready and RuntimeReady False with its reason",
			facts: sandboxFacts{problem: &problem{reason: v1alpha1.ReasonBackendUnavailable, message: "not started with incus"}, run: runForClaims},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: F, reason: v1alpha1.ReasonBackendUnavailable, message: "not started with incus"},
				v1alpha1.ConditionReady:        {status: F, reason: v1alpha1.ReasonBackendUnavailable, message: "not started with incus"},
			},
		},
		{
			name:  "running for claims",
			facts: sandboxFacts{instance: "cireilclaw-ada", live: 3, run: runForClaims, enforcement: enforcementOn},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady:    {status: T, reason: v1alpha1.ReasonRunning, message: "instance cireilclaw-ada is running for 3 claim(s)"},
				v1alpha1.ConditionReady:           {status: T, reason: v1alpha1.ReasonRunning, message: "running for 3 claim(s)"},
				v1alpha1.ConditionSandboxEnforced: {status: T, reason: v1alpha1.ReasonEnforced, message: "commands run inside bubblewrap"},
			},
		},
		{
			name:  "a pending restart keeps Ready while RuntimeReady says what waits",
			facts: sandboxFacts{instance: "i", live: 1, run: runForClaims, restartPending: "a new image"},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: F, reason: v1alpha1.ReasonRestartRequired, message: "must restart to apply a new image"},
				v1alpha1.ConditionReady:        {status: T, reason: v1alpha1.ReasonRunning, message: "a restart is pending"},
			},
		},
		{
			name:  "keepRunning without claims",
			facts: sandboxFacts{instance: "i", run: runKeepRunning},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: T, reason: v1alpha1.ReasonIdle, message: "keeps running (keepRunning)"},
				v1alpha1.ConditionReady:        {status: T, reason: v1alpha1.ReasonIdle, message: "keeps running"},
			},
		},
		{
			name:  "idle until its stop time",
			facts: sandboxFacts{instance: "i", run: runIdle, stopAt: stopAt},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: T, reason: v1alpha1.ReasonIdle, message: "stops at 2030-01-02T03:04:05Z"},
				v1alpha1.ConditionReady:        {status: T, reason: v1alpha1.ReasonIdle, message: "unless a SessionClaim binds"},
			},
		},
		{
			name:  "stopped: the runtime is as wanted, the Sandbox is not Ready",
			facts: sandboxFacts{instance: "i", run: runStopped},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: T, reason: v1alpha1.ReasonStopped, message: "starts when a SessionClaim binds"},
				v1alpha1.ConditionReady:        {status: F, reason: v1alpha1.ReasonStopped, message: "starts when"},
			},
		},
		{
			name:  "stopped once idle",
			facts: sandboxFacts{instance: "i", run: runStoppedIdle},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: T, reason: v1alpha1.ReasonStopped, message: "stopped; it starts"},
				v1alpha1.ConditionReady:        {status: F, reason: v1alpha1.ReasonStopped, message: "stopped; it starts"},
			},
		},
		{
			name:  "a failed stop outranks what was decided before it",
			facts: sandboxFacts{instance: "i", run: runIdle, problem: &problem{reason: "RuntimeUnavailable", message: "dial"}},
			expect: map[string]want{
				v1alpha1.ConditionRuntimeReady: {status: F, reason: "RuntimeUnavailable", message: "dial"},
				v1alpha1.ConditionReady:        {status: F, reason: "RuntimeUnavailable", message: "dial"},
			},
		},
		{
			name:  "another backend has no SandboxEnforced",
			facts: sandboxFacts{enforcement: enforcementNone},
			expect: map[string]want{
				v1alpha1.ConditionSandboxEnforced: {gone: true},
			},
		},
		{
			name:  "the insecure switch says so, with its value",
			facts: sandboxFacts{enforcement: enforcementOff, enforcementValue: "1"},
			expect: map[string]want{
				v1alpha1.ConditionSandboxEnforced: {status: F, reason: v1alpha1.ReasonSandboxDisabled, message: "INSECURE"},
			},
		},
		{
			name:  "a switch value that is no bypass is named and ignored",
			facts: sandboxFacts{enforcement: enforcementOn, enforcementValue: "maybe"},
			expect: map[string]want{
				v1alpha1.ConditionSandboxEnforced: {status: T, reason: v1alpha1.ReasonEnforced, message: `"maybe", which is not a bypass value`},
			},
		},
		{
			name:  "converged without overlays, worktrees or usage removes their conditions",
			facts: sandboxFacts{converged: true},
			expect: map[string]want{
				v1alpha1.ConditionOverlayHealthy: {gone: true},
				v1alpha1.ConditionGitHealthy:     {gone: true},
				v1alpha1.ConditionWithinLimits:   {gone: true},
			},
		},
		{
			name:  "usage within the limits",
			facts: sandboxFacts{converged: true, instance: "i", usage: &runtimes.Usage{Pids: 3}},
			expect: map[string]want{
				v1alpha1.ConditionOverlayHealthy: {gone: true},
				v1alpha1.ConditionGitHealthy:     {gone: true},
				v1alpha1.ConditionWithinLimits:   {status: T, reason: v1alpha1.ReasonWithinLimits, message: "no command of instance i"},
			},
		},
		{
			name:  "an OOM kill is named before a refused fork",
			facts: sandboxFacts{converged: true, instance: "i", usage: &runtimes.Usage{OOMKills: 2, PidsLimited: 5}},
			expect: map[string]want{
				v1alpha1.ConditionOverlayHealthy: {gone: true},
				v1alpha1.ConditionGitHealthy:     {gone: true},
				v1alpha1.ConditionWithinLimits:   {status: F, reason: v1alpha1.ReasonOOMKilled, message: "2 process(es) were killed at the memory limit"},
			},
		},
		{
			name:  "a refused fork",
			facts: sandboxFacts{converged: true, instance: "i", usage: &runtimes.Usage{PidsLimited: 5}},
			expect: map[string]want{
				v1alpha1.ConditionOverlayHealthy: {gone: true},
				v1alpha1.ConditionGitHealthy:     {gone: true},
				v1alpha1.ConditionWithinLimits:   {status: F, reason: v1alpha1.ReasonPidsLimitReached, message: "5 fork(s) were refused"},
			},
		},
		{
			name: "overlay health is the driver's, worktrees are summarised from live claims",
			facts: sandboxFacts{converged: true,
				overlay: &runtimes.Health{Reason: runtimes.ReasonUpperDirOverLimit, Message: "over its sizeLimit"},
				claims:  []v1alpha1.SessionClaim{worktreeClaim("a", true, v1alpha1.ReasonHealthy), worktreeClaim("b", false, v1alpha1.ReasonGitdirMissing), deleting}},
			expect: map[string]want{
				v1alpha1.ConditionOverlayHealthy: {status: F, reason: v1alpha1.ReasonUpperDirOverLimit, message: "over its sizeLimit"},
				v1alpha1.ConditionGitHealthy:     {status: F, reason: v1alpha1.ReasonGitdirMissing, message: "claim b: GitdirMissing: m-b"},
				v1alpha1.ConditionWithinLimits:   {gone: true},
			},
		},
		{
			name:  "every worktree healthy",
			facts: sandboxFacts{converged: true, overlay: &runtimes.Health{Healthy: true, Reason: runtimes.ReasonHealthy, Message: "ok"}, claims: []v1alpha1.SessionClaim{worktreeClaim("a", true, v1alpha1.ReasonHealthy), {}}},
			expect: map[string]want{
				v1alpha1.ConditionOverlayHealthy: {status: T, reason: v1alpha1.ReasonHealthy, message: "ok"},
				v1alpha1.ConditionGitHealthy:     {status: T, reason: v1alpha1.ReasonHealthy, message: "1 worktree(s) healthy"},
				v1alpha1.ConditionWithinLimits:   {gone: true},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.facts.generation = gen
			checkConditions(t, sandboxConditions(tc.facts), gen, tc.expect)
		})
	}
}

func TestFailErrUsesTheRuntimeReason(t *testing.T) {
	var f sandboxFacts
	f.failErr(runtimes.Errorf(runtimes.ReasonUnavailable, "inspecting", "i", "%w", errors.New("connection refused")))
	if f.problem == nil || f.problem.reason != v1alpha1.ReasonRuntimeUnavailable || !strings.Contains(f.problem.message, "connection refused") {
		t.Fatalf("problem = %+v", f.problem)
	}
}

func TestClaimConditions(t *testing.T) {
	const gen = 3
	T, F := metav1.ConditionTrue, metav1.ConditionFalse
	readySandbox := &metav1.Condition{Type: v1alpha1.ConditionReady, Status: T, Reason: v1alpha1.ReasonRunning}
	stoppedSandbox := &metav1.Condition{Type: v1alpha1.ConditionReady, Status: F, Reason: v1alpha1.ReasonMountSourceMissing, Message: "source /srv gone"}
	base := claimFacts{sandbox: "sb", namespace: "team", instance: "cireilclaw-ada"}
	with := func(mod func(*claimFacts)) claimFacts { f := base; mod(&f); return f }

	for _, tc := range []struct {
		name   string
		facts  claimFacts
		expect map[string]want
	}{
		{name: "nothing decided", facts: base, expect: map[string]want{}},
		{
			name:  "no Sandbox",
			facts: with(func(f *claimFacts) { f.binding = bindingNoSandbox }),
			expect: map[string]want{
				v1alpha1.ConditionBound: {status: F, reason: v1alpha1.ReasonSandboxNotFound, message: `Sandbox "sb" does not exist in namespace "team"`},
				v1alpha1.ConditionReady: {status: F, reason: v1alpha1.ReasonSandboxNotFound, message: "binds when it is created"},
			},
		},
		{
			name:  "Sandbox deleting",
			facts: with(func(f *claimFacts) { f.binding = bindingSandboxDeleting }),
			expect: map[string]want{
				v1alpha1.ConditionBound: {status: F, reason: v1alpha1.ReasonSandboxDeleting, message: "being deleted"},
				v1alpha1.ConditionReady: {status: F, reason: v1alpha1.ReasonSandboxDeleting, message: "being deleted"},
			},
		},
		{
			name:  "Sandbox without its agent",
			facts: with(func(f *claimFacts) { f.binding, f.conflict = bindingConflict, "Sandbox a/x already uses agent" }),
			expect: map[string]want{
				v1alpha1.ConditionBound: {status: F, reason: v1alpha1.ReasonNameConflict, message: "does not own its agent: Sandbox a/x"},
				v1alpha1.ConditionReady: {status: F, reason: v1alpha1.ReasonNameConflict, message: "already uses agent"},
			},
		},
		{
			name:  "bound to a Ready Sandbox, no worktree",
			facts: with(func(f *claimFacts) { f.binding, f.sandboxReady, f.worktree = bindingBound, readySandbox, worktreeNone }),
			expect: map[string]want{
				v1alpha1.ConditionBound:         {status: T, reason: v1alpha1.ReasonBound, message: `bound to Sandbox "sb"`},
				v1alpha1.ConditionReady:         {status: T, reason: v1alpha1.ReasonSandboxReady, message: "instance cireilclaw-ada is running"},
				v1alpha1.ConditionWorktreeReady: {gone: true},
				v1alpha1.ConditionGitHealthy:    {gone: true},
			},
		},
		{
			name:  "bound to a Sandbox that is not Ready repeats why",
			facts: with(func(f *claimFacts) { f.binding, f.sandboxReady = bindingBound, stoppedSandbox }),
			expect: map[string]want{
				v1alpha1.ConditionBound: {status: T, reason: v1alpha1.ReasonBound, message: "bound"},
				v1alpha1.ConditionReady: {status: F, reason: v1alpha1.ReasonSandboxNotReady, message: "MountSourceMissing: source /srv gone"},
			},
		},
		{
			name:  "bound to a Sandbox without a Ready condition yet",
			facts: with(func(f *claimFacts) { f.binding = bindingBound }),
			expect: map[string]want{
				v1alpha1.ConditionBound: {status: T, reason: v1alpha1.ReasonBound, message: "bound"},
				v1alpha1.ConditionReady: {status: F, reason: v1alpha1.ReasonSandboxNotReady, message: "not ready yet"},
			},
		},
		{
			// The coordinator, for a Sandbox no live node runs: Ready only,
			// Bound and the worktree as the node last wrote them.
			name: "a Sandbox on no live node",
			facts: with(func(f *claimFacts) {
				f.binding = bindingNoNode
				f.sandboxReady = &metav1.Condition{Type: v1alpha1.ConditionReady, Status: F, Reason: v1alpha1.ReasonNodeLost, Message: "node n2 lost since"}
			}),
			expect: map[string]want{
				v1alpha1.ConditionReady: {status: F, reason: v1alpha1.ReasonSandboxNotReady, message: `Sandbox "sb" is not ready: NodeLost: node n2 lost since`},
			},
		},
		{
			name: "a worktree that failed",
			facts: with(func(f *claimFacts) {
				f.worktree, f.worktreeProblem = worktreeFailed, problem{reason: v1alpha1.ReasonWorktreeFailed, message: "ref does not exist"}
			}),
			expect: map[string]want{
				v1alpha1.ConditionWorktreeReady: {status: F, reason: v1alpha1.ReasonWorktreeFailed, message: "ref does not exist"},
				v1alpha1.ConditionGitHealthy:    {status: F, reason: v1alpha1.ReasonWorktreeFailed, message: "no worktree: ref does not exist"},
			},
		},
		{
			name:  "a worktree waiting for its Sandbox",
			facts: with(func(f *claimFacts) { f.worktree, f.worktreeMessage = worktreeWaiting, "checked out once Sandbox" }),
			expect: map[string]want{
				v1alpha1.ConditionWorktreeReady: {status: F, reason: v1alpha1.ReasonWaitingForSandbox, message: "checked out once"},
				v1alpha1.ConditionGitHealthy:    {status: F, reason: v1alpha1.ReasonWaitingForSandbox, message: "checked out once"},
			},
		},
		{
			name: "a checked-out worktree with its health",
			facts: with(func(f *claimFacts) {
				f.worktree, f.worktreeMessage = worktreeCheckedOut, "checked out at main"
				f.git = gitHealth{reason: v1alpha1.ReasonProbeFailed, message: "rev-parse failed"}
			}),
			expect: map[string]want{
				v1alpha1.ConditionWorktreeReady: {status: T, reason: v1alpha1.ReasonWorktreeCreated, message: "checked out at main"},
				v1alpha1.ConditionGitHealthy:    {status: F, reason: v1alpha1.ReasonProbeFailed, message: "rev-parse failed"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.facts.generation = gen
			checkConditions(t, claimConditions(tc.facts), gen, tc.expect)
		})
	}
}

// applyConditions keeps a condition's transition time while its status
// stays, so a repeated reconcile writes nothing.
func TestApplyConditionsKeepsTransitionTimes(t *testing.T) {
	old := metav1.NewTime(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))
	conds := []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Running", LastTransitionTime: old},
		{Type: v1alpha1.ConditionOverlayHealthy, Status: metav1.ConditionTrue, Reason: "Healthy", LastTransitionTime: old},
	}
	applyConditions(&conds, sandboxConditions(sandboxFacts{instance: "i", live: 2, run: runForClaims, converged: true}))
	var ready *metav1.Condition
	for i := range conds {
		if conds[i].Type == v1alpha1.ConditionOverlayHealthy {
			t.Fatalf("OverlayHealthy kept though no overlay was reported: %+v", conds)
		}
		if conds[i].Type == v1alpha1.ConditionReady {
			ready = &conds[i]
		}
	}
	if ready == nil || !ready.LastTransitionTime.Equal(&old) || !strings.Contains(ready.Message, "2 claim(s)") {
		t.Fatalf("Ready = %+v, want its old transition time and the new message", ready)
	}
}

func TestPlacementConditions(t *testing.T) {
	const gen = 4
	F := metav1.ConditionFalse
	lost := "node b lost since 2026-01-02T03:04:05Z: lease expired"
	for _, tc := range []struct {
		name  string
		facts placementFacts
		want  want
	}{
		{"placed", placementFacts{outcome: placedOn, node: "a"}, want{status: F, reason: v1alpha1.ReasonPlaced, message: "placed on node a; waiting for its controller"}},
		{"unschedulable", placementFacts{outcome: unschedulable, why: "0/2 nodes are available: 2 Insufficient memory."}, want{status: F, reason: v1alpha1.ReasonUnschedulable, message: "no node runs this Sandbox yet: 0/2 nodes are available: 2 Insufficient memory."}},
		{"refused", placementFacts{outcome: unschedulable, reason: v1alpha1.ReasonPodRefused, why: "exceeded quota"}, want{status: F, reason: v1alpha1.ReasonPodRefused, message: "no node runs this Sandbox yet: exceeded quota"}},
		{"evicting", placementFacts{outcome: evicting, lost: "b", lostMsg: lost, evictAfter: 40 * time.Second}, want{status: F, reason: v1alpha1.ReasonNodeLost, message: lost + "; its Pod is evicted 40s after the node's loss"}},
		{"moved", placementFacts{outcome: movedOff, node: "a", lost: "b", lostMsg: lost}, want{status: F, reason: v1alpha1.ReasonNodeLost, message: lost + "; moved to node a (onNodeLost: Move): the agent's areas on b stay there"}},
		{"stranded", placementFacts{outcome: stranded, lost: "b", lostMsg: lost, why: "node a is full"}, want{status: F, reason: v1alpha1.ReasonNodeLost, message: lost + "; no other node can take it: node a is full"}},
		{"stays", placementFacts{outcome: staysOn, lost: "b", lostMsg: lost}, want{status: F, reason: v1alpha1.ReasonNodeLost, message: lost + "; it stays (onNodeLost: Stay)"}},
		{"pinned", placementFacts{outcome: staysOn, lost: "b", lostMsg: lost, pinned: true}, want{status: F, reason: v1alpha1.ReasonNodeLost, message: lost + "; it stays: spec.nodeName pins it there"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.facts.generation = gen
			checkConditions(t, placementConditions(tc.facts), gen, map[string]want{v1alpha1.ConditionReady: tc.want})
		})
	}
	if got := placementConditions(placementFacts{generation: gen}); len(got) != 0 {
		t.Errorf("no outcome derived %v, want nothing", got)
	}
}

func TestStartingForHoldsOnlyANewClaimOnAStoppedSandbox(t *testing.T) {
	created := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	newClaim := func(conds ...metav1.Condition) *v1alpha1.SessionClaim {
		c := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		c.Status.Conditions = conds
		return c
	}
	ready := func(status metav1.ConditionStatus, reason string) *metav1.Condition {
		return &metav1.Condition{Type: v1alpha1.ConditionReady, Status: status, Reason: reason}
	}
	bound := metav1.Condition{Type: v1alpha1.ConditionBound, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBound}
	soon := created.Add(time.Second)
	// queued: the Sandbox waits in this process for its first pass, which
	// will report it; past the grace its new claims look again instead of
	// writing, up to queuedGrace.
	for _, tc := range []struct {
		name    string
		claim   *v1alpha1.SessionClaim
		sandbox *metav1.Condition
		queued  bool
		now     time.Time
		want    time.Duration
	}{
		{"a new claim, Sandbox not reported yet", newClaim(), nil, false, soon, unreportedGrace - time.Second},
		{"a new claim past the stopped grace, Sandbox not reported yet", newClaim(), nil, false, created.Add(startGrace), unreportedGrace - startGrace},
		{"a new claim past the grace, Sandbox not reported yet", newClaim(), nil, false, created.Add(unreportedGrace), 0},
		{"a new claim, Sandbox stopped", newClaim(), ready(metav1.ConditionFalse, v1alpha1.ReasonStopped), false, soon, startGrace - time.Second},
		{"a new claim, Sandbox running", newClaim(), ready(metav1.ConditionTrue, v1alpha1.ReasonRunning), false, soon, 0},
		{"a new claim, Sandbox failed", newClaim(), ready(metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec), false, soon, 0},
		{"a claim that said Bound, Sandbox stopped", newClaim(bound), ready(metav1.ConditionFalse, v1alpha1.ReasonStopped), false, soon, 0},
		{"a new claim past the grace, Sandbox stopped", newClaim(), ready(metav1.ConditionFalse, v1alpha1.ReasonStopped), false, created.Add(startGrace), 0},
		{"a new claim before the grace, Sandbox queued", newClaim(), nil, true, soon, unreportedGrace - time.Second},
		{"a new claim past the grace, Sandbox queued", newClaim(), nil, true, created.Add(unreportedGrace), unreportedGrace},
		{"a new claim near queuedGrace, Sandbox queued", newClaim(), nil, true, created.Add(queuedGrace - time.Second), time.Second},
		{"a new claim past queuedGrace, Sandbox queued", newClaim(), nil, true, created.Add(queuedGrace), 0},
		{"a claim that said Bound, Sandbox queued", newClaim(bound), nil, true, created.Add(unreportedGrace), 0},
		{"a new claim past the stopped grace, Sandbox stopped and queued", newClaim(), ready(metav1.ConditionFalse, v1alpha1.ReasonStopped), true, created.Add(startGrace), 0},
	} {
		if got := startingFor(tc.claim, tc.sandbox, tc.queued, tc.now); got != tc.want {
			t.Errorf("%s: waits %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The Sandboxes seen created wait for their first pass until it is over,
// whatever it found.
func TestQueuedSandboxesLastUntilTheFirstPass(t *testing.T) {
	q := newQueuedSandboxes()
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sb"}}
	key := client.ObjectKeyFromObject(sb)
	if q.queued(key) {
		t.Fatal("queued before it was created")
	}
	if !q.created().Create(event.CreateEvent{Object: sb}) {
		t.Fatal("the create event was filtered out")
	}
	if !q.queued(key) {
		t.Fatal("not queued once created")
	}
	if !q.created().Update(event.UpdateEvent{ObjectOld: sb, ObjectNew: sb}) {
		t.Fatal("an update event was filtered out")
	}
	q.passed(key)
	if q.queued(key) {
		t.Fatal("still queued after its first pass")
	}
	var none *queuedSandboxes
	none.passed(key)
	if none.queued(key) {
		t.Fatal("a nil set holds a Sandbox")
	}
}

// The Sandbox's GitHealthy lists its unhealthy claims; however many the
// tenant makes, and however long the messages the agent's repository
// earns them, the summary fits the API's bound on a condition's message
// (32768 bytes), or the API server refuses the Sandbox's whole status.
func TestGitSummaryFitsAConditionMessage(t *testing.T) {
	const apiLimit = 32768
	claims := unhealthyClaims(64, v1alpha1.ReasonGitdirMismatch, strings.Repeat("m", maxConditionMessage))
	g := gitSummary(claims)
	if g == nil || g.healthy || g.reason != v1alpha1.ReasonGitdirMismatch {
		t.Fatalf("summary: %+v", g)
	}
	if len(g.message) > apiLimit {
		t.Fatalf("the summary is %d bytes, over the API's %d", len(g.message), apiLimit)
	}
	if !strings.Contains(g.message, "claim-00: ") || !strings.Contains(g.message, "64") {
		t.Fatalf("the summary names neither the first claim nor how many: %.200q", g.message)
	}
}

// Condition messages quote what agents, git, runtimes and specs say: a
// path of the agent's making, a lock reason, a runtime's error naming a
// file in the agent's areas. Each is cut at maxConditionMessage (the
// Sandbox's GitHealthy summary has a bound of its own), on a character
// boundary, so the message the API stores is the one derived and an
// unchanged status is not written again.
func TestConditionMessagesAreBounded(t *testing.T) {
	// One byte first, so a cut at the bound falls inside a character.
	long := "x" + strings.Repeat("é", 3*maxConditionMessage)
	ready := &metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonMountSourceMissing, Message: long}
	for _, tc := range []struct {
		name    string
		changes []conditionChange
	}{
		{"a claim's unhealthy worktree", claimConditions(claimFacts{binding: bindingBound, sandboxReady: ready,
			worktree: worktreeCheckedOut, worktreeMessage: long, git: gitHealth{reason: v1alpha1.ReasonWorktreeLocked, message: long}})},
		{"a claim's healthy worktree", claimConditions(claimFacts{binding: bindingBound,
			worktree: worktreeCheckedOut, worktreeMessage: long, git: gitHealth{healthy: true, reason: v1alpha1.ReasonHealthy, message: long}})},
		{"a claim's waiting worktree", claimConditions(claimFacts{binding: bindingNoNode, sandboxReady: ready, worktree: worktreeWaiting, worktreeMessage: long})},
		{"a claim whose Sandbox does not own its agent", claimConditions(claimFacts{binding: bindingConflict, conflict: long})},
		{"a Sandbox's problem", sandboxConditions(sandboxFacts{problem: &problem{reason: v1alpha1.ReasonMountSourceMissing, message: long}})},
		{"a Sandbox's overlay", sandboxConditions(sandboxFacts{converged: true, run: runForClaims,
			overlay: &runtimes.Health{Reason: runtimes.ReasonNotMounted, Message: long}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range tc.changes {
				m := c.condition.Message
				if len(m) > maxConditionMessage+len("…") || !utf8.ValidString(m) {
					t.Errorf("%s: %d bytes, valid UTF-8 %v", c.condition.Type, len(m), utf8.ValidString(m))
				}
			}
		})
	}
	claims := unhealthyClaims(4, v1alpha1.ReasonWorktreeLocked, long)
	for _, c := range sandboxConditions(sandboxFacts{converged: true, run: runForClaims, claims: claims}) {
		if c.condition.Type == v1alpha1.ConditionGitHealthy && !strings.Contains(c.condition.Message, "claim-03: ") {
			t.Errorf("the GitHealthy summary is cut to its claims' bound: %d bytes", len(c.condition.Message))
		}
	}
}

// unhealthyClaims are n claims with worktrees whose GitHealthy is False
// for reason, with message.
func unhealthyClaims(n int, reason, message string) []v1alpha1.SessionClaim {
	claims := make([]v1alpha1.SessionClaim, 0, n)
	for i := range n {
		c := v1alpha1.SessionClaim{}
		c.Name = fmt.Sprintf("claim-%02d", i)
		c.Spec.Worktree = &v1alpha1.WorktreeSpec{Repository: "repo"}
		c.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionGitHealthy, Status: metav1.ConditionFalse,
			Reason: reason, Message: message}}
		claims = append(claims, c)
	}
	return claims
}
