// Package kubeauth authenticates and authorises HTTP requests through the
// Kubernetes API server, as the kubelet and aggregated API servers do:
// bearer tokens by TokenReview, client certificates against a CA bundle,
// requests from a trusted proxy by its client certificate and identity
// headers, and every decision by SubjectAccessReview.
//
// It is written against client-go alone: the API server's own libraries
// for this bring its CEL and tracing stacks into every node's controller,
// for the handful of checks here.
package kubeauth

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
)

// User is who a request comes from.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Authenticator decides who a request comes from. ok is false when the
// request carries no credential of this kind or the credential is not
// accepted; err says why a credential could not be checked or was
// refused. A nil User is never returned with ok.
type Authenticator interface {
	Authenticate(r *http.Request) (u *User, ok bool, err error)
}

// AuthenticatorFunc is an Authenticator.
type AuthenticatorFunc func(r *http.Request) (*User, bool, error)

// Authenticate implements Authenticator.
func (f AuthenticatorFunc) Authenticate(r *http.Request) (*User, bool, error) { return f(r) }

// Union tries each authenticator in turn and takes the first that
// accepts the request; when none does, the errors of those that failed
// are returned together.
func Union(as ...Authenticator) Authenticator {
	return AuthenticatorFunc(func(r *http.Request) (*User, bool, error) {
		var errs []error
		for _, a := range as {
			u, ok, err := a.Authenticate(r)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if ok && u != nil && u.Name != "" {
				return u, true, nil
			}
		}
		return nil, false, errors.Join(errs...)
	})
}

// Attributes name what a request does: a verb on a resource (and
// subresource) of an API group, for a user.
type Attributes struct {
	User        *User
	Verb        string
	Namespace   string
	Group       string
	Version     string
	Resource    string
	Subresource string
	Name        string
}

// Authorizer decides whether a user may do what Attributes name. reason
// says why not, when the authority gave one; err when it could not be
// asked (then allowed is false).
type Authorizer interface {
	Authorize(ctx context.Context, a Attributes) (allowed bool, reason string, err error)
}

// AuthorizerFunc is an Authorizer.
type AuthorizerFunc func(ctx context.Context, a Attributes) (bool, string, error)

// Authorize implements Authorizer.
func (f AuthorizerFunc) Authorize(ctx context.Context, a Attributes) (bool, string, error) {
	return f(ctx, a)
}

// The WebSocket subprotocol a browser-style client sends its bearer token
// in (base64url, unpadded), as the API server takes it.
const bearerProtocolPrefix = "base64url.bearer.authorization.k8s.io."

// BearerToken returns the request's bearer token: from an Authorization
// header "Bearer <token>", or from a WebSocket subprotocol
// base64url.bearer.authorization.k8s.io.<token base64url>. ok is false
// when the request sends none, or sends one malformed.
func BearerToken(r *http.Request) (token string, ok bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, found := strings.Cut(strings.TrimSpace(h), " ")
		if !found || !strings.EqualFold(scheme, "bearer") {
			return "", false
		}
		tok = strings.TrimSpace(tok)
		if tok == "" || strings.ContainsAny(tok, " \t") {
			return "", false
		}
		return tok, true
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if enc, found := strings.CutPrefix(p, bearerProtocolPrefix); found {
				tok, err := decodeBase64URL(enc)
				if err != nil || tok == "" {
					return "", false
				}
				return tok, true
			}
		}
	}
	return "", false
}

// TokenFunc authenticates the request's bearer token (BearerToken) with
// check; a request without one is not authenticated.
func TokenFunc(check func(ctx context.Context, token string) (*User, bool, error)) Authenticator {
	return AuthenticatorFunc(func(r *http.Request) (*User, bool, error) {
		tok, ok := BearerToken(r)
		if !ok {
			return nil, false, nil
		}
		return check(r.Context(), tok)
	})
}

func decodeBase64URL(s string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return string(b), err
}
