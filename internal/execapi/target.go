package execapi

import (
	"context"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// target is the sandbox a claim's request acts on.
type target struct {
	claim    *v1alpha1.SessionClaim
	sandbox  *v1alpha1.Sandbox
	instance runtimes.Instance
	runtime  runtimes.Runtime
}

// resolve finds the claim's Sandbox and its instance description. The
// claim must be Bound; with ready, its Sandbox must also be Ready, so a
// command is refused at once rather than left waiting for an instance.
func (s *Server) resolve(ctx context.Context, ns, name string, ready bool) (*target, *apiError) {
	var claim v1alpha1.SessionClaim
	if err := s.opts.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &apiError{code: http.StatusNotFound, msg: fmt.Sprintf("SessionClaim %s/%s not found", ns, name)}
		}
		return nil, &apiError{code: http.StatusInternalServerError, msg: fmt.Sprintf("reading SessionClaim %s/%s: %v", ns, name, err)}
	}
	if claim.DeletionTimestamp != nil {
		return nil, notReady("SessionClaim %s/%s is being deleted", ns, name)
	}
	if c := meta.FindStatusCondition(claim.Status.Conditions, v1alpha1.ConditionBound); c == nil || c.Status != "True" {
		why := "the controller has not bound it yet"
		if c != nil {
			why = fmt.Sprintf("%s: %s", c.Reason, c.Message)
		}
		return nil, notReady("SessionClaim %s/%s is not Bound to its Sandbox %q (%s)", ns, name, claim.Spec.SandboxName, why)
	}
	var sb v1alpha1.Sandbox
	if err := s.opts.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: claim.Spec.SandboxName}, &sb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notReady("Sandbox %s/%s of SessionClaim %s is gone", ns, claim.Spec.SandboxName, name)
		}
		return nil, &apiError{code: http.StatusInternalServerError, msg: fmt.Sprintf("reading Sandbox %s/%s: %v", ns, claim.Spec.SandboxName, err)}
	}
	if sb.Spec.NodeName != s.opts.NodeName {
		return nil, &apiError{code: http.StatusMisdirectedRequest, msg: fmt.Sprintf("Sandbox %s/%s runs on node %q; this controller serves node %q: use the endpoint in the claim's status", ns, sb.Name, sb.Spec.NodeName, s.opts.NodeName)}
	}
	if ready {
		if c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != "True" {
			why := "no Ready condition yet"
			if c != nil {
				why = fmt.Sprintf("%s: %s", c.Reason, c.Message)
			}
			return nil, notReady("Sandbox %s/%s of SessionClaim %s is not Ready (%s)", ns, sb.Name, name, why)
		}
	}
	backend := sb.Spec.BackendOrDefault()
	rt := s.opts.Runtimes[backend]
	if rt == nil {
		return nil, &apiError{code: http.StatusServiceUnavailable, msg: fmt.Sprintf("Sandbox %s/%s uses backend %q, which this controller was not started with", ns, sb.Name, backend)}
	}
	in, err := runtimes.Describe(ns+"/"+sb.Name, &sb.Spec, s.opts.Host)
	if err != nil {
		return nil, &apiError{code: http.StatusConflict, msg: err.Error()}
	}
	return &target{claim: &claim, sandbox: &sb, instance: in, runtime: rt}, nil
}

func notReady(format string, args ...any) *apiError {
	return &apiError{code: http.StatusConflict, refusal: refusalNotReady, msg: fmt.Sprintf(format, args...)}
}
