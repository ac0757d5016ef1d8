package controllers

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/sandboxclass"
)

// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sandboxclasses,verbs=get;list;watch

// checkClass holds the Sandbox to its SandboxClass before anything of it
// starts, whatever admission let in: the admission policy may not be
// installed, and a class may have changed since the Sandbox was written.
// It runs before checkSpec, whose Describe gives the agent an id and a
// directory, so a forbidden spec creates nothing on the host. A running
// instance is left to the phases after only when the class allows it;
// otherwise it is stopped, since what it binds is no longer allowed.
func (r *SandboxReconciler) checkClass(ctx context.Context, s *sandboxScope) (bool, error) {
	res, violations, err := sandboxclass.Resolve(ctx, r.Client, &s.sb.Spec, r.Host)
	if err != nil {
		return false, err
	}
	if len(violations) == 0 {
		s.spec, s.host = res.Spec, res.Host
		r.warnDeprecated(s.sb)
		return false, nil
	}
	msg := strings.Join(violations, "; ")
	if c := findCondition(s.sb.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonClassForbids || c.Message != msg {
		r.Recorder.Event(s.sb, "Warning", v1alpha1.ReasonClassForbids, msg)
		log.FromContext(ctx).Info("the Sandbox's class forbids its spec; nothing starts", "problem", msg)
	}
	s.facts.fail(v1alpha1.ReasonClassForbids, msg)
	return true, r.stopForbidden(ctx, s, msg)
}

// warnDeprecated says, once per generation, which deprecated fields a
// Sandbox still uses and what replaces them.
func (r *SandboxReconciler) warnDeprecated(sb *v1alpha1.Sandbox) {
	fields := sb.Spec.UsesDeprecatedLimits()
	if len(fields) == 0 {
		return
	}
	if gen, seen := r.warned.Swap(sb.UID, sb.Generation); seen && gen == sb.Generation {
		return
	}
	r.Recorder.Eventf(sb, "Warning", EventDeprecatedField, "the Sandbox sets deprecated fields, read for one more release: %s", strings.Join(fields, "; "))
}

// EventDeprecatedField is the reason of the Event that names deprecated
// fields a Sandbox sets.
const EventDeprecatedField = "DeprecatedField"

// stopForbidden stops an instance this Sandbox owns that runs a spec its
// class no longer allows (the class changed under it).
func (r *SandboxReconciler) stopForbidden(ctx context.Context, s *sandboxScope, why string) error {
	name := v1alpha1.InstanceName(s.sb.Spec.Agent)
	st, err := s.rt.Inspect(ctx, name)
	if err != nil || !st.Exists || !st.Running || st.Owner != s.owner {
		// Inspect failing is not this phase's to report: the condition
		// already says why the Sandbox is not Ready.
		return nil //nolint:nilerr // reported by the condition already set, not by this phase
	}
	if err := s.rt.Stop(ctx, name); err != nil {
		return fmt.Errorf("stopping instance %s, which its SandboxClass no longer allows: %w", name, err)
	}
	r.Recorder.Eventf(s.sb, "Warning", v1alpha1.ReasonClassForbids, "stopped instance %s: %s", name, why)
	return nil
}

// classSandboxes re-queues every Sandbox of this node when a class
// changes: which class a Sandbox gets depends on every class (the default
// label, a name appearing), and classes change rarely.
func (r *SandboxReconciler) classSandboxes(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.SandboxList
	if err := r.List(ctx, &list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if onNode(&list.Items[i], r.NodeName) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}
