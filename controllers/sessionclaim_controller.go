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
	gen := claim.Generation
	before := claim.DeepCopy()
	claim.Status.ObservedGeneration = gen
	conds := &claim.Status.Conditions
	switch {
	case !found:
		msg := fmt.Sprintf("Sandbox %q does not exist in namespace %q; the claim binds when it is created", claim.Spec.SandboxName, claim.Namespace)
		setCondition(conds, gen, v1alpha1.ConditionBound, false, v1alpha1.ReasonSandboxNotFound, msg)
		setCondition(conds, gen, v1alpha1.ConditionReady, false, v1alpha1.ReasonSandboxNotFound, msg)
		claim.Status.Instance = ""
		return ctrl.Result{}, patchStatus(ctx, r.Client, before, claim, before.Status, claim.Status)
	case !sb.DeletionTimestamp.IsZero():
		msg := fmt.Sprintf("Sandbox %q is being deleted", sb.Name)
		setCondition(conds, gen, v1alpha1.ConditionBound, false, v1alpha1.ReasonSandboxDeleting, msg)
		setCondition(conds, gen, v1alpha1.ConditionReady, false, v1alpha1.ReasonSandboxDeleting, msg)
		return ctrl.Result{}, patchStatus(ctx, r.Client, before, claim, before.Status, claim.Status)
	}
	// A Sandbox that does not own its agent has nothing to bind to: the
	// instance and the areas are another Sandbox's, maybe another namespace's.
	conflict, err := claimConflict(ctx, r.Client, r.Host.AreasRoot, sb)
	if err != nil {
		return ctrl.Result{}, err
	}
	if conflict != "" {
		msg := fmt.Sprintf("Sandbox %q does not own its agent: %s", sb.Name, conflict)
		setCondition(conds, gen, v1alpha1.ConditionBound, false, v1alpha1.ReasonNameConflict, msg)
		setCondition(conds, gen, v1alpha1.ConditionReady, false, v1alpha1.ReasonNameConflict, msg)
		claim.Status.Instance, claim.Status.Endpoint = "", ""
		return ctrl.Result{}, patchStatus(ctx, r.Client, before, claim, before.Status, claim.Status)
	}

	claim.Status.Instance = v1alpha1.InstanceName(sb.Spec.Agent)
	claim.Status.Endpoint = r.Endpoint
	setCondition(conds, gen, v1alpha1.ConditionBound, true, v1alpha1.ReasonBound, fmt.Sprintf("bound to Sandbox %q", sb.Name))
	if conditionTrue(sb.Status.Conditions, v1alpha1.ConditionReady) {
		setCondition(conds, gen, v1alpha1.ConditionReady, true, v1alpha1.ReasonSandboxReady, fmt.Sprintf("instance %s is running", claim.Status.Instance))
	} else {
		msg := fmt.Sprintf("Sandbox %q is not ready yet", sb.Name)
		if c := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil {
			msg = fmt.Sprintf("Sandbox %q is not ready: %s: %s", sb.Name, c.Reason, c.Message)
		}
		setCondition(conds, gen, v1alpha1.ConditionReady, false, v1alpha1.ReasonSandboxNotReady, msg)
	}
	// Status first: the Sandbox counts its claims by name from the moment
	// they exist, so being bound waits for no other write, and a claim on
	// a running Sandbox is Ready after this one.
	if err := patchStatus(ctx, r.Client, before, claim, before.Status, claim.Status); err != nil {
		return ctrl.Result{}, err
	}
	// Then, in one write, the finalizer (a worktree is released before the
	// claim goes) and the owner reference (the claim goes with its Sandbox).
	changed := controllerutil.AddFinalizer(claim, v1alpha1.Finalizer)
	if !isOwnedBy(claim, sb) {
		if err := controllerutil.SetControllerReference(sb, claim, r.Scheme()); err != nil {
			return ctrl.Result{}, fmt.Errorf("making Sandbox %s the owner of claim %s: %w", sb.Name, req, err)
		}
		changed = true
	}
	if changed {
		if err := r.Update(ctx, claim); err != nil {
			return requeueOnConflict(err)
		}
	}

	before = claim.DeepCopy()
	defer func() {
		if err := patchStatus(ctx, r.Client, before, claim, before.Status, claim.Status); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	return r.reconcileWorktree(ctx, claim, sb)
}

// release removes the claim's worktree (or keeps it when dirty) and lets
// the claim go. The Sandbox hears of it through its claim watch and recounts.
func (r *SessionClaimReconciler) release(ctx context.Context, claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(claim, v1alpha1.Finalizer) {
		return nil
	}
	before := claim.DeepCopy()
	r.releaseWorktree(ctx, claim, sb)
	if err := patchStatus(ctx, r.Client, before, claim, before.Status, claim.Status); err != nil {
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
