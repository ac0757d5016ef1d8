package controllers

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// countDelay is how long a running Sandbox waits before it counts a claim
// that came or went. A claim on a running Sandbox is Ready by its own
// status write alone; the Sandbox's write of its new count, sent at the
// same moment, only competed with it for the API server (a claim took 8
// ms instead of 5), and a burst of claims on one Sandbox now costs it one
// count write instead of one a claim.
const countDelay = 100 * time.Millisecond

// claimsOfSandbox enqueues a claim's Sandbox when the claim comes, goes or
// changes what the Sandbox acts on (claimChangesForSandbox filters the
// updates). At once, except where the change is only one to count and the
// Sandbox is running: a stopped Sandbox starts for its first claim at
// once, and a worktree's git directory is mounted at once.
type claimsOfSandbox struct {
	// reader is the cache, where the Sandbox's Ready is looked up.
	reader client.Reader
}

func (h *claimsOfSandbox) enqueue(ctx context.Context, c *v1alpha1.SessionClaim, countOnly bool, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.SandboxName}}
	if countOnly {
		var sb v1alpha1.Sandbox
		if err := h.reader.Get(ctx, req.NamespacedName, &sb); err == nil && sb.DeletionTimestamp.IsZero() &&
			conditionTrue(sb.Status.Conditions, v1alpha1.ConditionReady) {
			q.AddAfter(req, countDelay)
			return
		}
	}
	q.Add(req)
}

// Create: a new claim binds on its own status; its Sandbox counts it.
func (h *claimsOfSandbox) Create(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c := e.Object.(*v1alpha1.SessionClaim)
	h.enqueue(ctx, c, gitDirOf(c) == "", q)
}

// Update: the deletion of a claim without a worktree only changes the
// count; anything else the filter lets through is acted on.
func (h *claimsOfSandbox) Update(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	o, n := e.ObjectOld.(*v1alpha1.SessionClaim), e.ObjectNew.(*v1alpha1.SessionClaim)
	countOnly := o.Generation == n.Generation && gitDirOf(o) == "" && gitDirOf(n) == "" &&
		sameCondition(o.Status.Conditions, n.Status.Conditions, v1alpha1.ConditionGitHealthy)
	h.enqueue(ctx, o, countOnly, q)
	if n.Spec.SandboxName != o.Spec.SandboxName {
		h.enqueue(ctx, n, countOnly, q)
	}
}

// Delete: the claim is gone (its release, if any, done).
func (h *claimsOfSandbox) Delete(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c := e.Object.(*v1alpha1.SessionClaim)
	h.enqueue(ctx, c, gitDirOf(c) == "", q)
}

func (h *claimsOfSandbox) Generic(ctx context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.enqueue(ctx, e.Object.(*v1alpha1.SessionClaim), false, q)
}
