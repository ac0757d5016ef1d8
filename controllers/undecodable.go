package controllers

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// reportUndecodable logs and records an Event for a Sandbox whose spec has
// fields Go could not decode. That happens only with a CRD installed
// without its admission rules; the API types then decode the rest of the
// object field by field (api/v1alpha1/decode.go) so that every other
// Sandbox keeps reconciling, and checkSpec reports this one InvalidSpec and
// runs nothing from it. Every reconcile logs it (a restarted controller
// says so again); the Event goes out once per generation.
func (r *SandboxReconciler) reportUndecodable(ctx context.Context, sb *v1alpha1.Sandbox) {
	errs := sb.Spec.UndecodedFields()
	if len(errs) == 0 {
		return
	}
	msg := errs.ToAggregate().Error()
	log.FromContext(ctx).Info("Sandbox has fields this controller cannot decode; it is reported InvalidSpec and nothing is run from it (is the CRD installed without its validation rules?)",
		"problems", msg)
	if sb.Status.ObservedGeneration != sb.Generation {
		r.Recorder.Event(sb, "Warning", v1alpha1.ReasonInvalidSpec, msg)
	}
}
