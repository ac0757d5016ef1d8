// Package exectoken turns a kubeconfig's credentials into credentials for
// the exec API that are useless against the API server: a client
// certificate as it is, or a bearer token issued for the exec API's own
// audience. It never sends a token the API server accepts as its own to
// the exec API, where every node's controller would see it.
package exectoken

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Lifetime is how long a token requested for one command is valid; the
// API server may raise it to its minimum (10 minutes).
const Lifetime = 10 * 60

// ForExecAPI returns a copy of cfg (a kubeconfig's configuration for the
// API server) whose only credential is one the exec API accepts for
// audience:
//   - tokenFile, when given, is read and sent as it is (a token the caller
//     got for the audience elsewhere, e.g. from their identity provider);
//   - a client certificate is kept and every other credential dropped;
//   - a service account token (from the kubeconfig or its token file) is
//     exchanged through the TokenRequest API for one with the audience,
//     unless it already carries the audience;
//   - anything else (an OIDC token, an exec plugin, a static token, a
//     password) is refused with what to do instead.
func ForExecAPI(ctx context.Context, cfg *rest.Config, audience, tokenFile string) (*rest.Config, error) {
	// A node's exec API authenticates the caller's own credential; it
	// takes no impersonation. Dropping it silently would run the command
	// as the caller while the claim was read as someone else.
	if imp := cfg.Impersonate; imp.UserName != "" || imp.UID != "" || len(imp.Groups) > 0 || len(imp.Extra) > 0 {
		return nil, fmt.Errorf("impersonation (--as %q, --as-group, --as-uid) is not possible on a node's exec API, which authenticates your own credential: go through the API server (--via api-server), which takes it", imp.UserName)
	}
	out := rest.CopyConfig(cfg)
	out.BearerToken, out.BearerTokenFile = "", ""
	out.Username, out.Password = "", ""
	out.AuthProvider, out.AuthConfigPersister, out.ExecProvider = nil, nil, nil
	out.Impersonate = rest.ImpersonationConfig{}

	if tokenFile != "" {
		tok, err := readToken(tokenFile)
		if err != nil {
			return nil, err
		}
		if c, isJWT := parseClaims(tok); !isJWT || !slices.Equal(c.Aud, []string{audience}) {
			return nil, fmt.Errorf("the token in %s is not issued for audience %q alone, and nodes refuse it: a node's controller sees the token sent to it, and one valid elsewhere too (for the API server) could be used there; request one with `kubectl create token SERVICE_ACCOUNT --audience %s`", tokenFile, audience, audience)
		}
		out.BearerToken = tok
		out.CertData, out.CertFile, out.KeyData, out.KeyFile = nil, "", nil, ""
		return out, nil
	}
	if hasClientCert(cfg) {
		return out, nil
	}
	tok := cfg.BearerToken
	if tok == "" && cfg.BearerTokenFile != "" {
		var err error
		if tok, err = readToken(cfg.BearerTokenFile); err != nil {
			return nil, err
		}
	}
	claims, isJWT := parseClaims(tok)
	ns, name, isSA := claims.serviceAccount()
	switch {
	case tok != "" && isJWT && slices.Equal(claims.Aud, []string{audience}):
		// For the exec API alone: a token also valid for the API server
		// (or anything else) would hand the node's controller that
		// credential; a service account's is exchanged below.
		out.BearerToken = tok
		return out, nil
	case tok != "" && isSA:
		t, err := request(ctx, cfg, ns, name, audience)
		if err != nil {
			return nil, err
		}
		out.BearerToken = t
		return out, nil
	}
	return nil, fmt.Errorf("the kubeconfig authenticates with neither a client certificate nor a service account token, "+
		"and the exec API accepts only tokens issued for audience %q (a token for the API server would be visible to every node's controller): "+
		"use a context with a client certificate, or pass a token for that audience with --api-token-file (see docs/exec-api.md)", audience)
}

func hasClientCert(cfg *rest.Config) bool {
	return (len(cfg.CertData) > 0 || cfg.CertFile != "") && (len(cfg.KeyData) > 0 || cfg.KeyFile != "")
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the token file %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("reading the token file %s: it is empty", path)
	}
	return tok, nil
}

// request asks the API server for a token of service account ns/name for
// audience, with cfg's own credentials (the service account's token).
func request(ctx context.Context, cfg *rest.Config, ns, name, audience string) (string, error) {
	// Through the dynamic client: the typed clientset would link every
	// API group's client into sandboxctl, whose one-shot run starts them all.
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("requesting an exec API token for service account %s/%s: %w", ns, name, err)
	}
	body, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&authnv1.TokenRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       authnv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To(int64(Lifetime))},
	})
	if err != nil {
		return "", fmt.Errorf("requesting an exec API token for service account %s/%s: %w", ns, name, err)
	}
	sa := schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	out, err := dc.Resource(sa).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: body}, metav1.CreateOptions{}, "token")
	if apierrors.IsForbidden(err) {
		return "", fmt.Errorf("requesting an exec API token (audience %q) for service account %s/%s: %w; "+
			"grant it create on serviceaccounts/token for its own name (resourceNames: [%s]), or mount a projected service account token with that audience and pass it with --api-token-file",
			audience, ns, name, err, name)
	}
	if err != nil {
		return "", fmt.Errorf("requesting an exec API token (audience %q) for service account %s/%s: %w", audience, ns, name, err)
	}
	token, _, _ := unstructured.NestedString(out.Object, "status", "token")
	if token == "" {
		return "", errors.New("requesting an exec API token: the API server answered without a token")
	}
	return token, nil
}

// claims are the parts of a JWT's payload this package reads. The token is
// the caller's own and is not verified here: the API server does that.
type claims struct {
	Sub string    `json:"sub"`
	Aud audiences `json:"aud"`
}

const saPrefix = "system:serviceaccount:"

func (c claims) serviceAccount() (ns, name string, ok bool) {
	tail, found := strings.CutPrefix(c.Sub, saPrefix)
	if !found {
		return "", "", false
	}
	ns, name, ok = strings.Cut(tail, ":")
	return ns, name, ok && ns != "" && name != ""
}

// parseClaims reads a JWT's payload; ok is false for anything else.
func parseClaims(tok string) (claims, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return claims{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return claims{}, false
	}
	var c claims
	if err := json.Unmarshal(b, &c); err != nil {
		return claims{}, false
	}
	return c, true
}

// audiences is a JWT aud claim: one string or a list of them.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("reading the aud claim: %w", err)
	}
	*a = many
	return nil
}
