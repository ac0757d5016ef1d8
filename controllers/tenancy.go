package controllers

import (
	"context"
	"errors"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/tenancy"
)

// agentConflict says why sb may not use its agent, or "" when it may. An
// agent belongs to the oldest Sandbox naming it in the cluster (agent
// names are unique cluster-wide; later Sandboxes wait), and its areas on
// this node to the namespace that first used them, for good: a Sandbox of
// another namespace never takes them over, not even after the first one
// is deleted. Both reconcilers ask before anything else, so a claim on a
// Sandbox that does not own its agent is never Bound.
func agentConflict(ctx context.Context, c client.Reader, areasRoot string, sb *v1alpha1.Sandbox) (string, error) {
	var list v1alpha1.SandboxList
	if err := c.List(ctx, &list, client.MatchingFields{indexSandboxAgent: sb.Spec.Agent}); err != nil {
		return "", fmt.Errorf("listing Sandboxes of agent %s: %w", sb.Spec.Agent, err)
	}
	if o := tenancy.Owner(list.Items); o != nil && o.UID != sb.UID && tenancy.Older(o, sb) {
		return fmt.Sprintf("Sandbox %s/%s already uses agent %q (agent names are unique in the cluster), so the instance name %s and the agent's areas are not this Sandbox's: choose another agent name",
			o.Namespace, o.Name, sb.Spec.Agent, v1alpha1.InstanceName(sb.Spec.Agent)), nil
	}
	var conflict *tenancy.ConflictError
	switch err := tenancy.Bind(areasRoot, sb.Spec.Agent, sb.Namespace); {
	case errors.As(err, &conflict):
		return conflict.Error(), nil
	case err != nil:
		return "", err
	}
	return "", nil
}

// checkNameConflict stops a Sandbox that does not own its agent, saying why.
func (r *SandboxReconciler) checkNameConflict(ctx context.Context, s *sandboxScope) (bool, error) {
	msg, err := agentConflict(ctx, r.Client, r.Host.AreasRoot, s.sb)
	if err != nil {
		return false, err
	}
	if msg != "" {
		s.facts.fail(v1alpha1.ReasonNameConflict, msg)
		return true, nil
	}
	return false, nil
}

// claimConflict is agentConflict for a claim, which also believes its
// Sandbox when that reports NameConflict: an instance of the agent owned by
// something else (found only when the Sandbox inspects its runtime) is as
// much not the Sandbox's to give out. A Sandbox never reads this of itself,
// so a conflict that has passed does not hold itself in place.
func claimConflict(ctx context.Context, c client.Reader, areasRoot string, sb *v1alpha1.Sandbox) (string, error) {
	msg, err := agentConflict(ctx, c, areasRoot, sb)
	if err != nil || msg != "" {
		return msg, err
	}
	if cond := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady); cond != nil && cond.Reason == v1alpha1.ReasonNameConflict {
		return cond.Message, nil
	}
	return "", nil
}
