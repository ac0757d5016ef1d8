package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// SessionClaimReconciler binds claims to their Sandbox and mirrors the
// Sandbox's readiness on them.
type SessionClaimReconciler struct {
	client.Client
	Options
	Recorder record.EventRecorder
	// status is the one writer of the claim's status.
	status statusWriter
	// notices tell a Sandbox's Ready before its status write is back
	// (readyNotices); nil: only the cache tells.
	notices *readyNotices
	// queued are the Sandboxes waiting for this process's first pass
	// (queuedSandboxes); nil: none.
	queued *queuedSandboxes
	// writes are told of this controller's status writes, which its
	// Sandbox's status write waits for (claimWrites); nil: none is told.
	writes *claimWrites
	// own are this process's recent status writes (ownWrites).
	own ownWrites
	// checkedOut holds, by claim UID, the worktree status this process
	// wrote when it checked a claim's worktree out. A pass whose cache has
	// not seen that write yet (a status read before it, whatever brought
	// the pass) takes it from here: adding the worktree and resetting it
	// again would wipe what the agent did in it since.
	checkedOut sync.Map
	// worktreeLocks keep a claim taking a worktree and another claim
	// releasing it apart.
	worktreeLocks worktreeLocks
}

// A claim with a worktree is updated for its finalizer and owner
// reference; every claim's status is only patched. Nothing is ever owned
// by a claim, so no sessionclaims/finalizers.
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sessionclaims,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sessionclaims/status,verbs=patch

// SetupWithManager watches SessionClaims and the Sandboxes they name, so a
// claim created before its Sandbox binds as soon as the Sandbox appears.
func (r *SessionClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	retries := newRetryLimiter()
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.SessionClaim{}, builder.WithPredicates(r.own.echoes())).
		Watches(&v1alpha1.Sandbox{}, handler.EnqueueRequestsFromMapFunc(r.claimsOf), builder.WithPredicates(sandboxChangesForClaims))
	if r.notices != nil {
		b = b.WatchesRawSource(source.Channel(r.notices.claims, &handler.EnqueueRequestForObject{}))
	}
	return b.Named("sessionclaim").
		WithOptions(controller.Options{
			MaxConcurrentReconciles: workers(r.ClaimWorkers, 16),
			ReconciliationTimeout:   reconcileTimeout(r.ReconcileTimeout),
			RateLimiter:             retries,
		}).
		Complete(withRetries(retries, r))
}

func (r *SessionClaimReconciler) claimsOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.SessionClaimList
	if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexClaimSandbox: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, c := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&c)})
	}
	return reqs
}

// Reconcile binds one claim.
func (r *SessionClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	claim := &v1alpha1.SessionClaim{}
	if err := r.Get(ctx, req.NamespacedName, claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	sbKey := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.SandboxName}
	// Written or not, the pass is over: its Sandbox's status write need
	// not wait for it any longer.
	defer r.writes.done(sbKey, req.NamespacedName)
	if r.own.stale(claim) {
		return ctrl.Result{RequeueAfter: staleRetry}, nil
	}
	sb := &v1alpha1.Sandbox{}
	err := r.Get(ctx, sbKey, sb)
	found := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reading Sandbox %s of claim %s: %w", claim.Spec.SandboxName, req, err)
	}
	// With a Sandbox on another node, that node's controller owns the claim.
	if found && !onNode(sb, r.NodeName) {
		return ctrl.Result{}, nil
	}

	if !claim.DeletionTimestamp.IsZero() {
		var owner *v1alpha1.Sandbox
		if found {
			owner = sb
		}
		return ctrl.Result{}, r.release(ctx, claim, owner)
	}
	read := claim.DeepCopy()
	f := claimFacts{generation: claim.Generation, sandbox: claim.Spec.SandboxName, namespace: claim.Namespace}
	pass := r.bind(ctx, claim, sb, found, &f)
	res, err := r.write(ctx, read, claim, &f, pass)
	if err != nil {
		return requeueOnConflict(err)
	}
	return res, nil
}

// claimPass is what one pass of a claim decided besides its facts.
type claimPass struct {
	err error
	// complete says the pass got as far as it can for this generation;
	// with no error, observedGeneration moves to it.
	complete bool
	// hold says the status waits: the claim's Sandbox is starting for it
	// (startingFor).
	hold bool
	res  ctrl.Result
}

// startGrace is how long a new claim on a stopped Sandbox waits for the
// Sandbox to start before it says Bound and not Ready.
const startGrace = 5 * time.Second

// unreportedGrace is how long a new claim waits on a Sandbox its
// controller has not reported yet (no Ready condition at all). That
// controller has a backlog: a thousand Sandboxes created at once are
// reported over seconds, and a claim that said Bound and not Ready at 5 s
// wrote its status twice (1.8 claim writes a claim at 1,000), adding to
// the API server's load just when it was the limit. A Sandbox no
// controller ever reports still leaves no claim without a status for
// long. A Sandbox queued here for its first pass holds its claims longer
// (queuedSandboxes).
const unreportedGrace = 30 * time.Second

// startingFor says how long more a new claim's first status waits, 0 when
// it goes now. A claim that has never said Bound, on a Sandbox that has
// not reported yet or is Stopped, waits: the Sandbox counts the claim and
// starts, and its Ready turning True, or a reason of why not, brings the
// claim back (sandboxChangesForClaims), which then writes Bound and Ready
// at once. A claim on a stopped Sandbox is so Ready after one write of its
// own instead of two, the second queued behind the first. Past startGrace
// (unreportedGrace for a Sandbox not reported yet) since its creation it
// writes what it has, so a Sandbox that never reacts leaves no claim
// without status; unless the Sandbox, not reported, is queued in this
// process for its first pass (queuedSandboxes): the claim then looks
// again every unreportedGrace, up to queuedGrace.
func startingFor(claim *v1alpha1.SessionClaim, sandboxReady *metav1.Condition, queued bool, now time.Time) time.Duration {
	if findCondition(claim.Status.Conditions, v1alpha1.ConditionBound) != nil {
		return 0
	}
	grace := unreportedGrace
	if sandboxReady != nil {
		if sandboxReady.Status == metav1.ConditionTrue || sandboxReady.Reason != v1alpha1.ReasonStopped {
			return 0
		}
		grace = startGrace
	}
	wait := max(claim.CreationTimestamp.Add(grace).Sub(now), 0)
	if left := claim.CreationTimestamp.Add(queuedGrace).Sub(now); wait == 0 && queued && sandboxReady == nil && left > 0 {
		return min(unreportedGrace, left)
	}
	return wait
}

// bind finds what the claim is to its Sandbox and records it in f and in
// the claim's status fields; it writes nothing, except the metadata a
// worktree needs before it is made.
func (r *SessionClaimReconciler) bind(ctx context.Context, claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox, found bool, f *claimFacts) claimPass {
	switch {
	case !found:
		f.binding = bindingNoSandbox
		claim.Status.Instance = ""
		return claimPass{complete: true}
	case !sb.DeletionTimestamp.IsZero():
		f.binding = bindingSandboxDeleting
		return claimPass{complete: true}
	}
	// A Sandbox that does not own its agent has nothing to bind to: the
	// instance and the areas are another Sandbox's, maybe another namespace's.
	conflict, err := claimConflict(ctx, r.Client, r.Host.AreasRoot, sb)
	if err != nil {
		return claimPass{err: err}
	}
	if conflict != "" {
		f.binding, f.conflict = bindingConflict, conflict
		claim.Status.Instance, claim.Status.Endpoint = "", ""
		return claimPass{complete: true}
	}

	readyOf := sandboxReadyCondition
	if claim.Spec.Worktree == nil {
		// The Sandbox's pass may have started it for this claim and not
		// yet seen its status write back: its notice says so.
		readyOf = r.notices.readyOf
	}
	f.binding, f.sandboxReady = bindingBound, readyOf(sb)
	claim.Status.Instance = v1alpha1.InstanceName(sb.Spec.Agent)
	claim.Status.Endpoint = r.Endpoint
	if claim.Spec.Worktree == nil {
		// Without a worktree the status is the one write: nothing is to
		// be released when the claim goes (the Sandbox counts its claims
		// by name and hears of the deletion), and a deleted Sandbox
		// deletes its claims itself (reconcileDelete), so the claim needs
		// neither a finalizer nor an owner reference.
		claim.Status.Worktree = nil
		f.worktree = worktreeNone
		if wait := startingFor(claim, f.sandboxReady, r.queued.queued(client.ObjectKeyFromObject(sb)), time.Now()); wait > 0 {
			return claimPass{complete: true, hold: true, res: ctrl.Result{RequeueAfter: wait}}
		}
		return claimPass{complete: true}
	}
	// With a worktree the metadata goes first: the finalizer must be there
	// before a worktree exists to release. Update answers with the stored
	// status, so the status this pass derives is set after it.
	status := claim.Status.DeepCopy()
	changed, err := r.metadata(claim, sb)
	if err == nil && changed {
		err = r.Update(ctx, claim)
	}
	claim.Status = *status
	if err != nil {
		return claimPass{err: err}
	}
	res, err := r.reconcileWorktree(ctx, claim, sb, f)
	return claimPass{err: err, complete: err == nil, res: res}
}

// write sends what the pass found: the claim's status, derived once from
// the facts (claimConditions). With the metadata a worktree needs, at most
// two writes on every path.
func (r *SessionClaimReconciler) write(ctx context.Context, read, claim *v1alpha1.SessionClaim, f *claimFacts, pass claimPass) (ctrl.Result, error) {
	if pass.hold {
		return pass.res, nil
	}
	f.instance = claim.Status.Instance
	applyConditions(&claim.Status.Conditions, claimConditions(*f))
	if pass.err == nil && pass.complete {
		claim.Status.ObservedGeneration = claim.Generation
	}
	r.writes.expect(types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.SandboxName}, client.ObjectKeyFromObject(claim))
	if err := r.status.writeStatus(ctx, read, claim, mergeConditions); err != nil {
		return ctrl.Result{}, errors.Join(pass.err, err)
	}
	r.own.wrote(read, claim)
	return pass.res, pass.err
}

// metadata sets the finalizer of a claim with a worktree (its worktree is
// released before the claim goes) and its owner reference (the claim goes
// with its Sandbox), and says whether either changed.
func (r *SessionClaimReconciler) metadata(claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) (bool, error) {
	changed := controllerutil.AddFinalizer(claim, v1alpha1.Finalizer)
	if !isOwnedBy(claim, sb) {
		if err := controllerutil.SetControllerReference(sb, claim, r.Scheme()); err != nil {
			return false, fmt.Errorf("making Sandbox %s the owner of claim %s/%s: %w", sb.Name, claim.Namespace, claim.Name, err)
		}
		changed = true
	}
	return changed, nil
}

// release removes the claim's worktree (or keeps it when dirty) and lets
// the claim go; a claim without the finalizer (no worktree) has gone
// already. The Sandbox hears of it through its claim watch and recounts.
func (r *SessionClaimReconciler) release(ctx context.Context, claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(claim, v1alpha1.Finalizer) {
		return nil
	}
	read := claim.DeepCopy()
	r.releaseWorktree(ctx, claim, sb)
	if err := r.status.writeStatus(ctx, read, claim, mergeConditions); err != nil {
		return err
	}
	controllerutil.RemoveFinalizer(claim, v1alpha1.Finalizer)
	return client.IgnoreNotFound(r.Update(ctx, claim))
}

func isOwnedBy(claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) bool {
	for _, ref := range claim.OwnerReferences {
		if ref.UID == sb.UID {
			return true
		}
	}
	return false
}
