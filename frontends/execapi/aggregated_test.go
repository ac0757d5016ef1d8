package execapi

import (
	"net/http"
	"testing"

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
