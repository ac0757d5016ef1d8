package kubeauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// reviewTimeout bounds one TokenReview or SubjectAccessReview.
const reviewTimeout = 10 * time.Second

// cacheEntries bounds each answer cache: a caller sending ever new
// tokens makes the API server review each, but cannot grow this process.
const cacheEntries = 4096

// retries is how often a review the API server failed to answer (it was
// unreachable, overloaded or timed out) is tried again, after 0.5 s and
// then 1.5 times longer each time.
const retries = 4

// TokenReviewer authenticates bearer tokens with TokenReview, for one
// audience: a token passes only when the API server says it was issued
// for that audience, so a token for the API server itself, or for
// anything else, is refused. Answers are kept for TTL (by the token's
// hash, never the token).
type TokenReviewer struct {
	Kube     kubernetes.Interface
	Audience string
	TTL      time.Duration

	cache answers[*User]
}

// Authenticate implements Authenticator.
func (t *TokenReviewer) Authenticate(r *http.Request) (*User, bool, error) {
	tok, ok := BearerToken(r)
	if !ok {
		return nil, false, nil
	}
	// Whoever a token is sent to may use it wherever it is valid, and a
	// node's controller sees every token sent to it: one valid for the
	// API server too (or for anything else) is refused before it is
	// reviewed, as TokenReview says only whether it is valid here.
	if aud, isJWT := Audiences(tok); !isJWT {
		return nil, false, fmt.Errorf("the token is not a JWT, so nothing shows it is for audience %q alone and not also a credential for the API server", t.Audience)
	} else if len(aud) != 1 || aud[0] != t.Audience {
		return nil, false, fmt.Errorf("the token is issued for %d audiences, not for %q alone: a node's controller sees the tokens sent to it, and this one is valid elsewhere too", len(aud), t.Audience)
	}
	sum := sha256.Sum256([]byte(tok))
	key := string(sum[:]) + "\x00" + t.Audience
	if u, hit := t.cache.get(key); hit {
		return u, u != nil, nil
	}
	u, err := t.review(r.Context(), tok)
	if err != nil {
		return nil, false, err
	}
	t.cache.put(key, u, t.TTL)
	return u, u != nil, nil
}

// review asks the API server who tok belongs to: nil when it is not a
// valid token for t.Audience.
func (t *TokenReviewer) review(ctx context.Context, tok string) (*User, error) {
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: []string{t.Audience}}}
	var got *authnv1.TokenReview
	err := withRetries(ctx, func(ctx context.Context) error {
		var err error
		got, err = t.Kube.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	st := got.Status
	if st.Error != "" {
		return nil, fmt.Errorf("TokenReview: %s", st.Error)
	}
	if !st.Authenticated || st.User.Username == "" || !slices.Contains(st.Audiences, t.Audience) {
		return nil, nil
	}
	u := &User{Name: st.User.Username, UID: st.User.UID, Groups: st.User.Groups}
	if len(st.User.Extra) > 0 {
		u.Extra = make(map[string][]string, len(st.User.Extra))
		for k, v := range st.User.Extra {
			u.Extra[k] = v
		}
	}
	return u, nil
}

// AccessReviewer authorises with SubjectAccessReview. Answers are kept
// for TTL.
type AccessReviewer struct {
	Kube kubernetes.Interface
	TTL  time.Duration

	cache answers[accessAnswer]
}

type accessAnswer struct {
	allowed bool
	reason  string
}

// Authorize implements Authorizer.
func (a *AccessReviewer) Authorize(ctx context.Context, at Attributes) (bool, string, error) {
	if at.User == nil {
		return false, "", errors.New("no user to authorise")
	}
	spec := authzv1.SubjectAccessReviewSpec{
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace:   at.Namespace,
			Verb:        at.Verb,
			Group:       at.Group,
			Version:     at.Version,
			Resource:    at.Resource,
			Subresource: at.Subresource,
			Name:        at.Name,
		},
		User:   at.User.Name,
		UID:    at.User.UID,
		Groups: at.User.Groups,
	}
	if len(at.User.Extra) > 0 {
		spec.Extra = make(map[string]authzv1.ExtraValue, len(at.User.Extra))
		for k, v := range at.User.Extra {
			spec.Extra[k] = v
		}
	}
	// The whole question is the key: JSON sorts the extras' keys. It is
	// kept by its hash, as a token is: the claim's name and namespace are
	// the request path's, as long as a caller likes (up to the server's
	// header limit).
	keyBytes, err := json.Marshal(&spec)
	if err != nil {
		return false, "", fmt.Errorf("SubjectAccessReview: %w", err)
	}
	sum := sha256.Sum256(keyBytes)
	key := string(sum[:])
	if ans, hit := a.cache.get(key); hit {
		return ans.allowed, ans.reason, nil
	}
	var got *authzv1.SubjectAccessReview
	err = withRetries(ctx, func(ctx context.Context) error {
		var err error
		got, err = a.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return false, "", fmt.Errorf("SubjectAccessReview: %w", err)
	}
	ans := accessAnswer{allowed: got.Status.Allowed && !got.Status.Denied, reason: got.Status.Reason}
	a.cache.put(key, ans, a.TTL)
	return ans.allowed, ans.reason, nil
}

// withRetries runs call, with reviewTimeout, again after a failure the
// API server may get over (it was unreachable, overloaded, or timed out);
// never after an answer that says the request itself is wrong.
func withRetries(ctx context.Context, call func(context.Context) error) error {
	wait := 500 * time.Millisecond
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, reviewTimeout)
		err := call(cctx)
		cancel()
		if err == nil || try == retries || !retryable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait = wait * 3 / 2
	}
}

func retryable(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true // no answer at all: a connection or a timeout
	}
	return apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err)
}

// answers keeps values for a while, up to cacheEntries of them.
type answers[V any] struct {
	mu sync.Mutex
	m  map[string]answer[V]
}

type answer[V any] struct {
	v       V
	expires time.Time
}

func (c *answers[V]) get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !time.Now().Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *answers[V]) put(key string, v V, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]answer[V]{}
	}
	if len(c.m) >= cacheEntries {
		for k, e := range c.m {
			if !now.Before(e.expires) {
				delete(c.m, k)
			}
		}
		// Still full of live answers: forget any quarter of them.
		for k := range c.m {
			if len(c.m) < cacheEntries*3/4 {
				break
			}
			delete(c.m, k)
		}
	}
	c.m[key] = answer[V]{v: v, expires: now.Add(ttl)}
}
