package execapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// The subresources of a SessionClaim that requests are authorised against.
const (
	subresourceExec  = "exec"
	subresourceFiles = "files"
)

// Auth decides who a request comes from and what it may do.
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// run, when set, keeps the client CA bundle reloaded until ctx ends.
	run func(ctx context.Context)
}

// The manager asks the API server who a caller is and what they may do.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// DelegatingAuth authenticates the way the kubelet does: bearer tokens by
// TokenReview and client certificates against clientCAFile (skipped when
// empty), and authorises every request by SubjectAccessReview, both through
// the API server behind kube. Anonymous requests are not authenticated.
func DelegatingAuth(kube kubernetes.Interface, clientCAFile string, cacheTTL time.Duration) (Auth, error) {
	if cacheTTL <= 0 {
		cacheTTL = DefaultAuthCacheTTL
	}
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	var a Auth
	authn := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
		CacheTTL:                 cacheTTL,
	}
	if clientCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca", clientCAFile)
		if err != nil {
			return Auth{}, fmt.Errorf("loading the client CA bundle %s: %w", clientCAFile, err)
		}
		authn.ClientCertificateCAContentProvider = ca
		a.run = func(ctx context.Context) { ca.Run(ctx, 1) }
	}
	var err error
	if a.Authenticator, _, err = authn.New(); err != nil {
		return Auth{}, fmt.Errorf("building the delegating authenticator: %w", err)
	}
	authz := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             cacheTTL,
		DenyCacheTTL:              cacheTTL,
		WebhookRetryBackoff:       backoff,
	}
	if a.Authorizer, err = authz.New(); err != nil {
		return Auth{}, fmt.Errorf("building the delegating authorizer: %w", err)
	}
	return a, nil
}

// authenticate returns the caller, or answers 401 and returns nil.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) user.Info {
	resp, ok, err := s.auth.Authenticator.AuthenticateRequest(r)
	if err != nil || !ok || resp.User == nil || resp.User.GetName() == "" {
		msg := "no credentials: send a bearer token or a client certificate; anonymous requests are refused"
		if err != nil {
			msg = "authentication failed: " + err.Error()
		}
		s.refuse(w, r, nil, &apiError{code: http.StatusUnauthorized, refusal: refusalUnauthenticated, msg: msg})
		return nil
	}
	return resp.User
}

// authorize checks verb on sessionclaims/<sub> for the claim and answers
// 403 when it is not allowed.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, u user.Info, verb, sub, ns, name string) bool {
	attrs := authorizer.AttributesRecord{
		User:            u,
		Verb:            verb,
		Namespace:       ns,
		APIGroup:        v1alpha1.GroupVersion.Group,
		APIVersion:      v1alpha1.GroupVersion.Version,
		Resource:        "sessionclaims",
		Subresource:     sub,
		Name:            name,
		ResourceRequest: true,
		Path:            r.URL.Path,
	}
	decision, reason, err := s.auth.Authorizer.Authorize(r.Context(), attrs)
	if decision == authorizer.DecisionAllow {
		return true
	}
	msg := fmt.Sprintf("user %q cannot %s resource \"sessionclaims/%s\" in API group %q in the namespace %q for SessionClaim %q",
		u.GetName(), verb, sub, v1alpha1.GroupVersion.Group, ns, name)
	if reason != "" {
		msg += ": " + reason
	}
	if err != nil {
		msg += fmt.Sprintf(" (authorization failed: %v)", err)
	}
	s.refuse(w, r, u, &apiError{code: http.StatusForbidden, refusal: refusalForbidden, msg: msg})
	return false
}
