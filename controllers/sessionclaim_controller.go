package controllers

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// SessionClaimReconciler binds claims to their Sandbox and mirrors the
// Sandbox's readiness on them.
type SessionClaimReconciler struct {
	client.Client
	Options
	Recorder record.EventRecorder
}

// A claim is updated for its finalizer and owner reference, its status only
// patched; nothing is ever owned by a claim, so no sessionclaims/finalizers.
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sessionclaims,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sessionclaims/status,verbs=patch

// SetupWithManager watches SessionClaims and the Sandboxes they name, so a
// claim created before its Sandbox binds as soon as the Sandbox appears.
func (r *SessionClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	retries := newRetryLimiter()
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.SessionClaim{}).
		Watches(&v1alpha1.Sandbox{}, handler.EnqueueRequestsFromMapFunc(r.claimsOf), builder.WithPredicates(sandboxChangesForClaims)).
		Named("sessionclaim").
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
func (r *SessionClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	claim := &v1alpha1.SessionClaim{}
	if err := r.Get(ctx, req.NamespacedName, claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	sb := &v1alpha1.Sandbox{}
	err := r.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.SandboxName}, sb)
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
	// One pass, at most two writes: the claim's status, derived once from
	// what the pass found (claimConditions), and its metadata when it
	// binds; observedGeneration moves only when the pass succeeded.
	f := claimFacts{generation: claim.Generation, sandbox: claim.Spec.SandboxName, namespace: claim.Namespace}
	oldStatus := claim.Status.DeepCopy()
	complete, statusWritten := false, false
	writeStatus := func(done bool) error {
		f.instance = claim.Status.Instance
		applyConditions(&claim.Status.Conditions, claimConditions(f))
		claim.Status.ObservedGeneration = oldStatus.ObservedGeneration
		if done {
			claim.Status.ObservedGeneration = claim.Generation
		}
		// Against the claim as it is now (metadata included, after an
		// Update) but with the status as read: only the status changes go.
		asRead := claim.DeepCopy()
		asRead.Status = *oldStatus
		statusWritten = true
		return snapshot(asRead).write(ctx, r.Client, claim)
	}
	defer func() {
		if statusWritten {
			return
		}
		if err := writeStatus(retErr == nil && complete); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	switch {
	case !found:
		f.binding, complete = bindingNoSandbox, true
		claim.Status.Instance = ""
		return ctrl.Result{}, nil
	case !sb.DeletionTimestamp.IsZero():
		f.binding, complete = bindingSandboxDeleting, true
		return ctrl.Result{}, nil
	}
	// A Sandbox that does not own its agent has nothing to bind to: the
	// instance and the areas are another Sandbox's, maybe another namespace's.
	conflict, err := claimConflict(ctx, r.Client, r.Host.AreasRoot, sb)
	if err != nil {
		return ctrl.Result{}, err
	}
	if conflict != "" {
		f.binding, f.conflict, complete = bindingConflict, conflict, true
		claim.Status.Instance, claim.Status.Endpoint = "", ""
		return ctrl.Result{}, nil
	}

	f.binding, f.sandboxReady = bindingBound, sandboxReadyCondition(sb)
	// The finalizer (a worktree is released before the claim goes) and the
	// owner reference (the claim goes with its Sandbox), in one write; set
	// on the object as it is just before that write (a status write
	// answers with the stored object).
	metadata := func() (bool, error) {
		changed := controllerutil.AddFinalizer(claim, v1alpha1.Finalizer)
		if !isOwnedBy(claim, sb) {
			if err := controllerutil.SetControllerReference(sb, claim, r.Scheme()); err != nil {
				return false, fmt.Errorf("making Sandbox %s the owner of claim %s: %w", sb.Name, req, err)
			}
			changed = true
		}
		return changed, nil
	}
	if claim.Spec.Worktree == nil {
		// Without a worktree the status goes first, final: the Sandbox
		// counts its claims by name from the moment they exist, so being
		// bound waits for no other write, and a claim on a running
		// Sandbox is Ready after this one. The metadata follows; should
		// it fail, observedGeneration is put back.
		claim.Status.Worktree = nil
		claim.Status.Instance = v1alpha1.InstanceName(sb.Spec.Agent)
		claim.Status.Endpoint = r.Endpoint
		f.worktree = worktreeNone
		if err := writeStatus(true); err != nil {
			return ctrl.Result{}, err
		}
		changed, err := metadata()
		if err == nil && !changed {
			return ctrl.Result{}, nil
		}
		if err == nil {
			err = r.Update(ctx, claim)
		}
		if err != nil {
			read := claim.DeepCopy()
			claim.Status.ObservedGeneration = oldStatus.ObservedGeneration
			return requeueOnConflict(errors.Join(err, snapshot(read).write(ctx, r.Client, claim)))
		}
		return ctrl.Result{}, nil
	}
	// With a worktree the metadata goes first: the finalizer must be there
	// before a worktree exists to release. Update answers with the stored
	// status, so the status this pass derives is set after it.
	changed, err := metadata()
	if err != nil {
		return ctrl.Result{}, err
	}
	if changed {
		if err := r.Update(ctx, claim); err != nil {
			claim.Status = *oldStatus.DeepCopy()
			return requeueOnConflict(err)
		}
		claim.Status = *oldStatus.DeepCopy()
	}
	claim.Status.Instance = v1alpha1.InstanceName(sb.Spec.Agent)
	claim.Status.Endpoint = r.Endpoint
	res, err := r.reconcileWorktree(ctx, claim, sb, &f)
	complete = err == nil
	return res, err
}

// release removes the claim's worktree (or keeps it when dirty) and lets
// the claim go. The Sandbox hears of it through its claim watch and recounts.
func (r *SessionClaimReconciler) release(ctx context.Context, claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(claim, v1alpha1.Finalizer) {
		return nil
	}
	read := snapshot(claim)
	r.releaseWorktree(ctx, claim, sb)
	if err := read.write(ctx, r.Client, claim); err != nil {
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
