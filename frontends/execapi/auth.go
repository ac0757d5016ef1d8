package execapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
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
	// FrontProxy, when set, authenticates requests the API server proxies
	// to the aggregated API (FrontProxyAuth).
	FrontProxy authenticator.Request
	// Peer, when set, authenticates requests another node's exec API
	// forwards (PeerAuth).
	Peer authenticator.Request
	// run, when set, keeps the client CA bundle reloaded until ctx ends.
	run func(ctx context.Context)
	// prepare, when set, starts what keeps authentication current until
	// ctx ends and waits for its first load, before the server accepts
	// its first request.
	prepare func(ctx context.Context)
}

// The manager asks the API server who a caller is and what they may do.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// DelegatingAuth authenticates the way the kubelet does: bearer tokens by
// TokenReview and client certificates against c.ClientCAFile (or the API
// server's client CA with c.ClusterClientCA; skipped when neither), and authorises every request by SubjectAccessReview, both through
// the API server behind kube. Anonymous requests are not authenticated.
// Every TokenReview names c.Audience (the server puts it on each request),
// so only tokens issued for the exec API pass.
func DelegatingAuth(kube kubernetes.Interface, c Config) (Auth, error) {
	c = c.withDefaults()
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	var a Auth
	authn := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
		CacheTTL:                 c.AuthCacheTTL,
		// No APIAudiences: they would be taken as the token's audiences
		// when a review answers without any. A token passes only when the
		// API server says it was issued for c.Audience.
	}
	if c.ClientCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca", c.ClientCAFile)
		if err != nil {
			return Auth{}, fmt.Errorf("loading the client CA bundle %s: %w", c.ClientCAFile, err)
		}
		authn.ClientCertificateCAContentProvider = ca
		a.run = func(ctx context.Context) { ca.Run(ctx, 1) }
	} else if c.ClusterClientCA {
		ca, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", authConfigMapNS, authConfigMap, clientCAKey, kube)
		if err != nil {
			return Auth{}, fmt.Errorf("watching the API server's client CA: %w", err)
		}
		authn.ClientCertificateCAContentProvider = ca
		// Read once before serving (a ConfigMap that is missing or not
		// readable leaves client certificates refused; tokens still work),
		// then kept current.
		a.prepare = func(ctx context.Context) {
			loadCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_ = ca.RunOnce(loadCtx)
			go ca.Run(ctx, 1)
		}
	}
	var err error
	if a.Authenticator, _, err = authn.New(); err != nil {
		return Auth{}, fmt.Errorf("building the delegating authenticator: %w", err)
	}
	authz := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             c.AuthCacheTTL,
		DenyCacheTTL:              c.AuthCacheTTL,
		WebhookRetryBackoff:       backoff,
	}
	if a.Authorizer, err = authz.New(); err != nil {
		return Auth{}, fmt.Errorf("building the delegating authorizer: %w", err)
	}
	return a, nil
}

// authenticate returns the caller and how it was authenticated, or
// answers 401 and returns nil. The caller's own bearer token is reviewed
// for the exec API's audience: without it the API server reviews a token
// for its own audiences, and any token that works against the API server
// (a service account's, a user's kubeconfig token) would work here, where
// each node's controller sees it.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (user.Info, via) {
	resp, how, errs := s.authenticateVia(r)
	if resp != nil {
		return resp.User, how
	}
	msg := "no credentials: send a bearer token issued for audience " + s.cfg.Audience + " or a client certificate; anonymous requests are refused"
	if hasBearerToken(r) {
		msg = fmt.Sprintf("bearer token refused: the exec API accepts only tokens issued for audience %q, and a plain service account token or a kubeconfig's token is not one. "+
			"Get one with `kubectl create token SERVICE_ACCOUNT --audience %s` (kubectl sandbox does this for a service account kubeconfig), "+
			"mount a projected service account token with that audience, or use a client certificate",
			s.cfg.Audience, s.cfg.Audience)
	}
	if len(errs) > 0 {
		msg += " (authentication failed: " + strings.Join(errs, "; ") + ")"
	}
	s.refuse(w, r, nil, &apiError{code: http.StatusUnauthorized, refusal: refusalUnauthenticated, msg: msg})
	return nil, viaCredentials
}

// hasBearerToken reports whether the request sends a bearer token, in the
// Authorization header or, for a browser-style WebSocket, as a subprotocol.
func hasBearerToken(r *http.Request) bool {
	if strings.HasPrefix(strings.ToLower(r.Header.Get("Authorization")), "bearer ") {
		return true
	}
	for _, p := range r.Header.Values("Sec-WebSocket-Protocol") {
		if strings.Contains(p, "base64url.bearer.authorization.k8s.io.") {
			return true
		}
	}
	return false
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
