package execapi

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
)

func TestSetIdentityDropsCredentialsAndNamesTheUser(t *testing.T) {
	h := http.Header{}
	h.Set("Authorization", "Bearer user-token")
	h.Set("Proxy-Authorization", "Basic x")
	h.Set("X-Remote-User", "mallory")
	h.Add("X-Remote-Group", "system:masters")
	h.Set("X-Remote-Extra-Scopes", "all")
	h.Set("Impersonate-User", "admin")
	h.Set("Sec-WebSocket-Protocol", "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.dG9rZW4")
	h.Set("Accept", "*/*")
	setIdentity(h, &kubeauth.User{Name: "alice", UID: "u-1", Groups: []string{"developers", "system:authenticated"}, Extra: map[string][]string{"team/name": {"a"}}})

	for _, k := range []string{"Authorization", "Proxy-Authorization", "Impersonate-User", "X-Remote-Extra-Scopes"} {
		if v := h.Values(k); len(v) != 0 {
			t.Errorf("%s kept: %q", k, v)
		}
	}
	if got := h.Values("X-Remote-User"); len(got) != 1 || got[0] != "alice" {
		t.Errorf("X-Remote-User = %q, want alice alone", got)
	}
	if got := h.Get("X-Remote-Uid"); got != "u-1" {
		t.Errorf("X-Remote-Uid = %q", got)
	}
	if got := h.Values("X-Remote-Group"); len(got) != 2 || got[0] != "developers" || got[1] != "system:authenticated" {
		t.Errorf("X-Remote-Group = %q, want alice's groups alone", got)
	}
	if got := h.Get("X-Remote-Extra-Team%2Fname"); got != "a" {
		t.Errorf("extra not sent path-escaped: %v", h)
	}
	if got := h.Get("Sec-WebSocket-Protocol"); got != "v5.channel.k8s.io" {
		t.Errorf("Sec-WebSocket-Protocol = %q, want the bearer token subprotocol dropped", got)
	}
	if h.Get("Accept") != "*/*" {
		t.Error("other headers must be kept")
	}
}

// An extra's key is any string the authenticator gives (an OIDC claim's
// name, a webhook's): forwarded, it must still be a header name, and read
// back as the same key.
func TestExtraKeysAreSentAsHeaderNames(t *testing.T) {
	keys := []string{"example.org:scope", "a=b@c/d", "key with space", "é%", "authentication.kubernetes.io/credential-id"}
	u := &kubeauth.User{Name: "alice", Extra: map[string][]string{}}
	for i, k := range keys {
		u.Extra[k] = []string{strconv.Itoa(i)}
	}
	h := http.Header{}
	setIdentity(h, u)
	got := map[string]string{}
	for name, vs := range h {
		rest, ok := strings.CutPrefix(name, "X-Remote-Extra-")
		if !ok {
			continue
		}
		if !httpguts.ValidHeaderFieldName(name) {
			t.Errorf("header name %q is not one a request may carry", name)
		}
		key, err := url.PathUnescape(rest)
		if err != nil {
			t.Errorf("header name %q does not unescape: %v", name, err)
		}
		got[strings.ToLower(key)] = vs[0]
	}
	for i, k := range keys {
		if got[strings.ToLower(k)] != strconv.Itoa(i) {
			t.Errorf("extra %q not read back from %v", k, h)
		}
	}
}

func TestForwardsOnlyRequestsFromTheAPIServerForAnotherNode(t *testing.T) {
	s := &Server{forwardTransport: http.DefaultTransport}
	misdirected := &apiError{code: http.StatusMisdirectedRequest, endpoint: "10.0.0.2:10350"}
	if !s.forwards(viaFrontProxy, misdirected) {
		t.Error("a request through the API server for another node's Sandbox is forwarded")
	}
	if s.forwards(viaPeer, misdirected) {
		t.Error("a forwarded request is never forwarded again")
	}
	if s.forwards(viaCredentials, misdirected) {
		t.Error("a direct request is answered 421, not forwarded")
	}
	if s.forwards(viaFrontProxy, &apiError{code: http.StatusMisdirectedRequest}) {
		t.Error("no endpoint, nothing to forward to")
	}
	if s.forwards(viaFrontProxy, &apiError{code: http.StatusConflict, endpoint: "10.0.0.2:10350"}) {
		t.Error("only a misdirected request is forwarded")
	}
	if (&Server{}).forwards(viaFrontProxy, misdirected) {
		t.Error("without Forwarding nothing is forwarded")
	}
}
