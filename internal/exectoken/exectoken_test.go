package exectoken

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const audience = "sandbox.cireilclaw.dev/exec"

// jwt builds an unsigned token with the given claims; ForExecAPI reads
// claims and leaves verification to the API server.
func jwt(t *testing.T, claims map[string]any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(b) + ".c2ln"
}

// The cases that need no API server; the TokenRequest exchange itself is
// tested against a real one in test/e2e/execapi.
func TestForExecAPI(t *testing.T) {
	fromIdP := jwt(t, map[string]any{"sub": "alice@example.com", "aud": audience})
	file := func(tok string) string {
		p := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokenFile := file(fromIdP)
	withAudience := jwt(t, map[string]any{"sub": "system:serviceaccount:team:agent", "aud": []string{audience}})
	oidc := jwt(t, map[string]any{"sub": "alice@example.com", "aud": "kubernetes"})
	// Valid at the API server too: whoever it is sent to could use it there.
	alsoForTheAPIServer := jwt(t, map[string]any{"sub": "alice@example.com", "aud": []string{audience, "kubernetes"}})
	for _, tc := range []struct {
		name      string
		cfg       rest.Config
		tokenFile string
		wantToken string
		wantCert  bool
		wantErr   string
	}{
		{name: "a client certificate goes alone", cfg: rest.Config{BearerToken: "api-server-token", TLSClientConfig: rest.TLSClientConfig{CertData: []byte("c"), KeyData: []byte("k")}}, wantCert: true},
		{name: "an explicit token file wins and goes alone", cfg: rest.Config{BearerToken: "api-server-token", TLSClientConfig: rest.TLSClientConfig{CertData: []byte("c"), KeyData: []byte("k")}}, tokenFile: tokenFile, wantToken: fromIdP},
		{name: "a token file also valid elsewhere is refused", cfg: rest.Config{}, tokenFile: file(alsoForTheAPIServer), wantErr: "not issued for audience"},
		{name: "a token file that is no JWT is refused", cfg: rest.Config{}, tokenFile: file("opaque"), wantErr: "not issued for audience"},
		{name: "a token also valid elsewhere is never forwarded", cfg: rest.Config{BearerToken: alsoForTheAPIServer}, wantErr: "accepts only tokens issued for audience"},
		{name: "a token that already has the audience is used", cfg: rest.Config{BearerToken: withAudience}, wantToken: withAudience},
		{name: "an OIDC token is never forwarded", cfg: rest.Config{BearerToken: oidc}, wantErr: "accepts only tokens issued for audience"},
		{name: "a static token is never forwarded", cfg: rest.Config{BearerToken: "static-token"}, wantErr: "--api-token-file"},
		{name: "an exec plugin is never run for the exec API", cfg: rest.Config{ExecProvider: &clientcmdapi.ExecConfig{Command: "kubelogin"}}, wantErr: "neither a client certificate nor a service account token"},
		{name: "basic auth is never forwarded", cfg: rest.Config{Username: "u", Password: "p"}, wantErr: "neither a client certificate"},
		{name: "a missing token file", cfg: rest.Config{}, tokenFile: filepath.Join(t.TempDir(), "absent"), wantErr: "reading the token file"},
		{name: "impersonation is refused, never dropped", cfg: rest.Config{Impersonate: rest.ImpersonationConfig{UserName: "alice"}, TLSClientConfig: rest.TLSClientConfig{CertData: []byte("c"), KeyData: []byte("k")}}, wantErr: "--via api-server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ForExecAPI(context.Background(), &tc.cfg, audience, tc.tokenFile)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.BearerToken != tc.wantToken || got.BearerTokenFile != "" || got.Username != "" || got.Password != "" || got.ExecProvider != nil || got.AuthProvider != nil {
				t.Fatalf("credentials %+v, want only token %q", got, tc.wantToken)
			}
			if hasCert := len(got.CertData) > 0; hasCert != tc.wantCert {
				t.Fatalf("client certificate sent: %v, want %v", hasCert, tc.wantCert)
			}
		})
	}
}
