package execapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
)

// The subresources of a SessionClaim that requests are authorised against.
const (
	subresourceExec  = "exec"
	subresourceFiles = "files"
)

// Auth decides who a request comes from and what it may do.
type Auth struct {
	Authenticator kubeauth.Authenticator
	Authorizer    kubeauth.Authorizer
	// FrontProxy, when set, authenticates requests the API server proxies
	// to the aggregated API (FrontProxyAuth).
	FrontProxy kubeauth.Authenticator
	// Peer, when set, authenticates requests another node's exec API
	// forwards (PeerAuth).
	Peer kubeauth.Authenticator
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
// server's client CA with c.ClusterClientCA; skipped when neither), and
// authorises every request by SubjectAccessReview, both through the API
// server behind kube (internal/kubeauth). Anonymous requests are not
// authenticated. Every TokenReview names c.Audience, and a token passes
// only when the API server says it was issued for it.
func DelegatingAuth(kube kubernetes.Interface, c Config) (Auth, error) {
	c = c.withDefaults()
	var a Auth
	tokens := &kubeauth.TokenReviewer{Kube: kube, Audience: c.Audience, TTL: c.AuthCacheTTL}
	switch {
	case c.ClientCAFile != "":
		ca, err := kubeauth.FileCA("client CA bundle", c.ClientCAFile)
		if err != nil {
			return Auth{}, fmt.Errorf("loading the client CA bundle %s: %w", c.ClientCAFile, err)
		}
		a.Authenticator = kubeauth.Union(kubeauth.ClientCert(ca), tokens)
		a.run = func(ctx context.Context) { ca.WatchFile(ctx, c.ClientCAFile, nil) }
	case c.ClusterClientCA:
		cm := &kubeauth.ConfigMap{Kube: kube, Namespace: authConfigMapNS, Name: authConfigMap}
		ca := kubeauth.CAFrom("the API server's client CA (ConfigMap "+authConfigMapNS+"/"+authConfigMap+")", cm, clientCAKey, nil)
		a.Authenticator = kubeauth.Union(kubeauth.ClientCert(ca), tokens)
		// Read once before serving (a ConfigMap that is missing or not
		// readable leaves client certificates refused; tokens still work),
		// then kept current.
		a.prepare = func(ctx context.Context) {
			loadCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, _ = cm.Load(loadCtx)
			go cm.Run(ctx, nil)
		}
	default:
		a.Authenticator = tokens
	}
	a.Authorizer = &kubeauth.AccessReviewer{Kube: kube, TTL: c.AuthCacheTTL}
	return a, nil
}

// authenticate returns the caller and how it was authenticated, or
// answers 401 and returns nil. The caller's own bearer token is reviewed
// for the exec API's audience: without it the API server reviews a token
// for its own audiences, and any token that works against the API server
// (a service account's, a user's kubeconfig token) would work here, where
// each node's controller sees it.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (*kubeauth.User, via) {
	u, how, errs := s.authenticateVia(r)
	if u != nil {
		return u, how
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
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, u *kubeauth.User, verb, sub, ns, name string) bool {
	attrs := kubeauth.Attributes{
		User:        u,
		Verb:        verb,
		Namespace:   ns,
		Group:       v1alpha1.GroupVersion.Group,
		Version:     v1alpha1.GroupVersion.Version,
		Resource:    "sessionclaims",
		Subresource: sub,
		Name:        name,
	}
	allowed, reason, err := s.auth.Authorizer.Authorize(r.Context(), attrs)
	if allowed && err == nil {
		return true
	}
	msg := fmt.Sprintf("user %q cannot %s resource \"sessionclaims/%s\" in API group %q in the namespace %q for SessionClaim %q",
		u.Name, verb, sub, v1alpha1.GroupVersion.Group, ns, name)
	if reason != "" {
		msg += ": " + reason
	}
	if err != nil {
		msg += fmt.Sprintf(" (authorization failed: %v)", err)
	}
	s.refuse(w, r, u, &apiError{code: http.StatusForbidden, refusal: refusalForbidden, msg: msg})
	return false
}
