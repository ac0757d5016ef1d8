package execapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
	"github.com/cireilclaw/sandbox-controller/internal/tenancy"
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
	if ready {
		s.awaitSandboxReady(ctx, &claim, &sb)
	}
	if sb.Node() == "" && (s.opts.ForwardOnly || s.opts.NodeName != "") && !s.opts.ForwardUnplaced {
		// No node's certificate can be asked for: the endpoint would be
		// believed for whatever address it gives, and a taken node can
		// write it.
		return nil, notReady("Sandbox %s/%s of SessionClaim %s is placed on no node yet, so no node serves it here; try again once it is placed (status.nodeName)", ns, sb.Name, name)
	}
	if s.opts.ForwardOnly || sb.Node() != s.opts.NodeName {
		// A Sandbox that is not Ready elsewhere (its node lost, say) is
		// said so here, not forwarded to an endpoint that may be gone.
		if ready {
			if e := notReadySandbox(ns, name, &sb); e != nil {
				return nil, e
			}
		}
		if s.opts.ForwardOnly {
			if claim.Status.Endpoint == "" {
				return nil, notReady("SessionClaim %s/%s has no endpoint yet: no node's controller serves its Sandbox %q yet", ns, name, sb.Name)
			}
			return nil, &apiError{code: http.StatusMisdirectedRequest, endpoint: claim.Status.Endpoint, node: sb.Node(), msg: fmt.Sprintf("Sandbox %s/%s runs on node %q: this is the aggregated API, which runs nothing; use the endpoint in the claim's status, or go through the API server", ns, sb.Name, sb.Node())}
		}
		return nil, &apiError{code: http.StatusMisdirectedRequest, endpoint: claim.Status.Endpoint, node: sb.Node(), msg: fmt.Sprintf("Sandbox %s/%s runs on node %q; this controller serves node %q: use the endpoint in the claim's status", ns, sb.Name, sb.Node(), s.opts.NodeName)}
	}
	if e := s.checkOwner(ns, name, &sb); e != nil {
		return nil, e
	}
	if e := checkAdmitted(ns, name, &sb); e != nil {
		return nil, e
	}
	if ready {
		if e := notReadySandbox(ns, name, &sb); e != nil {
			return nil, e
		}
	}
	backend := sb.Spec.BackendOrDefault()
	rt := s.opts.Runtimes[backend]
	if rt == nil {
		return nil, &apiError{code: http.StatusServiceUnavailable, msg: fmt.Sprintf("Sandbox %s/%s uses backend %q, which this controller was not started with", ns, sb.Name, backend)}
	}
	// The file endpoints do not wait for Ready, so they must hold the
	// Sandbox to its class here as the controller does: never a view of a
	// mount its class forbids, and the sources the class checked.
	in, _, err := sandboxclass.Describe(ctx, s.opts.Reader, &sb, s.opts.Host)
	var forbidden *sandboxclass.ForbiddenError
	switch {
	case errors.As(err, &forbidden):
		return nil, notReady("%s", err.Error())
	case errors.Is(err, sandboxclass.ErrClassUnavailable):
		return nil, &apiError{code: http.StatusServiceUnavailable, msg: err.Error()}
	case errors.Is(err, instance.ErrNotPrepared):
		// Requests never create anything for an agent: the Sandbox
		// reconciler prepares it first.
		return nil, notReady("Sandbox %s/%s is not prepared on this node yet (%v); try again once its controller has seen it", ns, sb.Name, err)
	case err != nil:
		return nil, &apiError{code: http.StatusConflict, msg: err.Error()}
	}
	return &target{claim: &claim, sandbox: &sb, instance: in, runtime: rt}, nil
}

// sandboxCatchUp bounds how long a request waits for this process's cache
// to show a claim's Sandbox as Ready as the claim says it is.
const sandboxCatchUp = time.Second

// awaitSandboxReady waits, up to sandboxCatchUp, for the cache to show sb
// Ready when the claim says Ready and sb's last change of readiness is not
// newer than the claim's: the controller writes a claim's Ready beside
// its Sandbox's, not after it, so a client that saw the claim Ready may
// ask before the Sandbox's write is in this cache. sb is then the cached
// Sandbox as it last read it.
func (s *Server) awaitSandboxReady(ctx context.Context, claim *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) {
	cr := meta.FindStatusCondition(claim.Status.Conditions, v1alpha1.ConditionReady)
	if cr == nil || cr.Status != metav1.ConditionTrue {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, sandboxCatchUp)
	defer cancel()
	for {
		sr := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady)
		if sr != nil && (sr.Status == metav1.ConditionTrue || sr.LastTransitionTime.After(cr.LastTransitionTime.Time)) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
		var again v1alpha1.Sandbox
		if err := s.opts.Reader.Get(ctx, client.ObjectKeyFromObject(sb), &again); err != nil || again.UID != sb.UID {
			return
		}
		*sb = again
	}
}

// checkOwner refuses a claim whose Sandbox does not own its agent. The
// claim's Bound condition says so already; this holds even when a status
// lags, and the file endpoints, which do not wait for Ready, depend on it:
// the areas of an agent on this node belong to one namespace (tenancy.Bind),
// and a Sandbox of another namespace naming the same agent never reaches them.
func (s *Server) checkOwner(ns, claim string, sb *v1alpha1.Sandbox) *apiError {
	if c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Reason == v1alpha1.ReasonNameConflict {
		return notReady("Sandbox %s/%s of SessionClaim %s does not own its agent %q: %s", ns, sb.Name, claim, sb.Spec.Agent, c.Message)
	}
	var conflict *tenancy.ConflictError
	switch err := tenancy.Bind(s.opts.Host.AreasRoot, sb.Spec.Agent, ns); {
	case errors.As(err, &conflict):
		return notReady("Sandbox %s/%s of SessionClaim %s does not own its agent %q: %v", ns, sb.Name, claim, sb.Spec.Agent, conflict)
	case err != nil:
		// The error names host paths; the caller gets none.
		s.log.Error(err, "checking which namespace an agent belongs to", "agent", sb.Spec.Agent, "sandbox", ns+"/"+sb.Name)
		return &apiError{code: http.StatusInternalServerError, msg: fmt.Sprintf("checking which namespace agent %q belongs to failed; the controller's log says why", sb.Spec.Agent)}
	}
	return nil
}

// checkAdmitted refuses a claim whose Sandbox is being deleted or whose
// class forbids it, as its status says; the class itself is checked again
// below (the status may lag a class that changed). The file endpoints,
// which do not wait for Ready, depend on it.
func checkAdmitted(ns, claim string, sb *v1alpha1.Sandbox) *apiError {
	if sb.DeletionTimestamp != nil {
		return notReady("Sandbox %s/%s of SessionClaim %s is being deleted", ns, sb.Name, claim)
	}
	if c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Reason == v1alpha1.ReasonClassForbids {
		return notReady("the SandboxClass of Sandbox %s/%s forbids its spec: %s", ns, sb.Name, c.Message)
	}
	return nil
}

func notReady(format string, args ...any) *apiError {
	return &apiError{code: http.StatusConflict, refusal: refusalNotReady, msg: fmt.Sprintf(format, args...)}
}

// notReadySandbox is the error for a claim whose Sandbox is not Ready,
// with the Sandbox's reason; nil when it is Ready.
func notReadySandbox(ns, claim string, sb *v1alpha1.Sandbox) *apiError {
	c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady)
	if c != nil && c.Status == "True" {
		return nil
	}
	why := "no Ready condition yet"
	if c != nil {
		why = fmt.Sprintf("%s: %s", c.Reason, c.Message)
	}
	return notReady("Sandbox %s/%s of SessionClaim %s is not Ready (%s)", ns, sb.Name, claim, why)
}

// claimTarget resolves the claim a request names for u; when it runs on
// another node it forwards the request there (a front proxy's request),
// else it answers the refusal. ok is false when the request is answered.
func (s *Server) claimTarget(w http.ResponseWriter, r *http.Request, u *kubeauth.User, how via, ns, name string, ready bool) (*target, bool) {
	t, aerr := s.resolve(r.Context(), ns, name, ready)
	if aerr == nil {
		return t, true
	}
	if s.forwards(how, aerr) {
		s.forward(w, r, u, aerr.endpoint, aerr.node)
	} else {
		s.refuse(w, r, u, aerr)
	}
	return nil, false
}
