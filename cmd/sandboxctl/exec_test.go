package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// scriptedRuntime stands in for a sandbox: it knows echo, cat and fail.
type scriptedRuntime struct{ runtimes.Runtime }

func (scriptedRuntime) Exec(_ context.Context, _ string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	switch req.Argv[0] {
	case "echo":
		fmt.Fprintln(req.Stdout, strings.Join(req.Argv[1:], " "))
	case "cat":
		_, err := io.Copy(req.Stdout, req.Stdin)
		return runtimes.ExitStatus{}, err
	case "fail":
		fmt.Fprintln(req.Stderr, "failing")
		return runtimes.ExitStatus{Code: 7}, nil
	}
	return runtimes.ExitStatus{}, nil
}

// execCluster serves, on one TLS server, the SessionClaim (as the API
// server would, with status.endpoint pointing back at itself) and the exec
// API, and writes a kubeconfig for it.
func execCluster(t *testing.T) string {
	kc, _ := execClusterWithAreas(t)
	return kc
}

// execClusterWithAreas is execCluster, also returning the areas root the
// file endpoints serve.
func execClusterWithAreas(t *testing.T) (string, string) {
	t.Helper()
	areasRoot := t.TempDir()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ready := []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Test", LastTransitionTime: metav1.Now()}}
	bound := []metav1.Condition{{Type: v1alpha1.ConditionBound, Status: metav1.ConditionTrue, Reason: "Test", LastTransitionTime: metav1.Now()}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "ada"}, Spec: v1alpha1.SandboxSpec{Agent: "ada", Binaries: []v1alpha1.BinaryName{"echo", "cat", "fail"}}, Status: v1alpha1.SandboxStatus{Conditions: ready}},
		&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "s1"}, Spec: v1alpha1.SessionClaimSpec{SandboxName: "ada"}, Status: v1alpha1.SessionClaimStatus{Conditions: bound}},
	).WithStatusSubresource(&v1alpha1.Sandbox{}, &v1alpha1.SessionClaim{}).Build()
	// The Sandbox reconciler prepares the agent: its id and its areas.
	if err := instance.Prepare(&v1alpha1.SandboxSpec{Agent: "ada"}, instance.Host{AreasRoot: areasRoot}); err != nil {
		t.Fatal(err)
	}
	authn := kubeauth.TokenFunc(func(_ context.Context, tok string) (*kubeauth.User, bool, error) {
		if tok == kubeconfigToken {
			t.Errorf("the exec API was sent the kubeconfig's token, which the API server accepts")
		}
		if tok != agentToken {
			return nil, false, errors.New("unknown token")
		}
		return &kubeauth.User{Name: "agent"}, true, nil
	})
	allow := kubeauth.AuthorizerFunc(func(context.Context, kubeauth.Attributes) (bool, string, error) {
		return true, "", nil
	})
	api, err := execapi.New(execapi.Config{}, execapi.Options{
		Reader:     c,
		Runtimes:   map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: scriptedRuntime{}},
		Host:       instance.Host{AreasRoot: areasRoot},
		Auth:       execapi.Auth{Authenticator: authn, Authorizer: allow},
		Registerer: prometheus.NewRegistry(),
		Log:        logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	mux.Handle("/api/v1alpha1/", api.Handler())
	mux.HandleFunc("/apis/sandbox.cireilclaw.dev/v1alpha1/namespaces/team/sessionclaims/s1", func(w http.ResponseWriter, r *http.Request) {
		impersonated.Store(r.Header.Get("Impersonate-User") + "|" + strings.Join(r.Header.Values("Impersonate-Group"), ","))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"SessionClaim","metadata":{"name":"s1","namespace":"team"},"status":{"endpoint":%q}}`, strings.TrimPrefix(srv.URL, "https://"))
	})
	mux.HandleFunc("/apis/sandbox.cireilclaw.dev/v1alpha1/namespaces/team/sessionclaims", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"SessionClaimList","metadata":{},"items":[`+
			`{"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"SessionClaim","metadata":{"name":"s1","namespace":"team"}},`+
			`{"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"SessionClaim","metadata":{"name":"s2","namespace":"team"}}]}`)
	})
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	err = os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: %s}
contexts:
- name: c
  context: {cluster: c, user: u, namespace: team}
current-context: c
`, srv.URL, kubeconfigToken)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(kc), "exec-token"), []byte(agentToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc, areasRoot
}

// impersonated is what the last claim request asked to impersonate:
// "user|group,group".
var impersonated atomic.Value

// agentToken is the exec API's token of the agent's service account: a
// JWT of the exec audience alone, as the API server issues one (the test's
// exec API authenticates it by name, not signature).
var agentToken = "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(`{"aud":["sandbox.cireilclaw.dev/exec"],"sub":"system:serviceaccount:team:agent"}`)) + ".c2ln"

// kubeconfigToken is the kubeconfig's own token: it reads the claim from
// the API server and must never reach the exec API.
const kubeconfigToken = "kubeconfig-token"

// execFlags point sandboxctl at kc and at the token for the exec API
// written beside it.
func execFlags(kc string) []string {
	return []string{"--kubeconfig", kc, "--insecure-skip-tls-verify", "--api-token-file", filepath.Join(filepath.Dir(kc), "exec-token")}
}

func TestExecThroughTheAPI(t *testing.T) {
	kc := execCluster(t)
	tests := []struct {
		name      string
		args      []string
		stdin     string
		code      int
		out, errs string
	}{
		{"stdout and exit 0", []string{"s1", "--", "echo", "hello", "there"}, "", 0, "hello there\n", ""},
		{"exit code is the command's", []string{"s1", "--", "fail"}, "", 7, "", "failing\n"},
		{"stdin with -i", []string{"-i", "s1", "--", "cat"}, "piped\n", 0, "piped\n", ""},
		{"refused command exits 126", []string{"s1", "--", "rm", "-rf", "/"}, "", exitRefused, "", "command refused"},
		{"unknown claim", []string{"-n", "elsewhere", "s1", "--", "echo"}, "", exitFailed, "", "reading SessionClaim elsewhere/s1"},
		{"no command", []string{"s1", "--"}, "", exitUsage, "", "a command after -- is required"},
		{"a kubeconfig token is never forwarded", []string{"--api-token-file=", "s1", "--", "echo"}, "", exitFailed, "", "the exec API accepts only tokens issued for audience \"sandbox.cireilclaw.dev/exec\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			code := run(append(append([]string{"exec"}, execFlags(kc)...), tc.args...), strings.NewReader(tc.stdin), &out, &errb)
			stdout, errs := out.String(), errb.String()
			if code != tc.code || stdout != tc.out || !strings.Contains(errs, tc.errs) {
				t.Fatalf("got exit %d stdout %q stderr %q; want exit %d stdout %q stderr containing %q", code, stdout, errs, tc.code, tc.out, tc.errs)
			}
		})
	}
}

// kubectl users put flags anywhere: after the claim and the paths too, and
// kubectl's impersonation flags are read. A node's exec API takes no
// impersonation: --as through a node is refused, never dropped (the
// command would run as the caller while the claim was read as another).
func TestFlagsAfterThePositionalArguments(t *testing.T) {
	kc, areasRoot := execClusterWithAreas(t)
	local := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(local, []byte("flags last\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"cp", local, "s1:/workspace/"}, execFlags(kc)...)
	args = append(args, "-n", "team", "--request-timeout", "20s")
	if code, _, stderr := sandboxctl(t, "", args...); code != 0 {
		t.Fatalf("cp with its flags last: exit %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(areasRoot, "ada", "workspace", "notes.txt")); err != nil || string(b) != "flags last\n" {
		t.Fatalf("the upload: %q, %v", b, err)
	}
	if err := os.Remove(filepath.Join(areasRoot, "ada", "workspace", "notes.txt")); err != nil {
		t.Fatal(err)
	}
	args = append(args, "--as", "alice", "--as-group", "devs", "--as-group", "agents")
	if code, _, stderr := sandboxctl(t, "", args...); code != exitFailed || !strings.Contains(stderr, "--via api-server") {
		t.Fatalf("cp through a node with --as: exit %d: %s; want it refused, naming --via api-server", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(areasRoot, "ada", "workspace", "notes.txt")); !os.IsNotExist(err) {
		t.Fatalf("cp through a node with --as uploaded as the caller: %v", err)
	}
	if got, _ := impersonated.Load().(string); got != "alice|devs,agents" {
		t.Fatalf("the claim was read impersonating %q, want alice with groups devs and agents", got)
	}
	bad := append(append([]string{"cp", local, "s1:/workspace/"}, execFlags(kc)...), "--request-timeout", "soon")
	if code, _, stderr := sandboxctl(t, "", bad...); code != exitFailed || !strings.Contains(stderr, "--request-timeout \"soon\"") {
		t.Fatalf("a bad --request-timeout: exit %d: %s", code, stderr)
	}
}

func TestCopyThroughTheAPI(t *testing.T) {
	kc, areasRoot := execClusterWithAreas(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(local, []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := execFlags(kc)
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"upload into a directory", []string{local, "s1:/workspace/"}, 0, ""},
		{"download", []string{"s1:/workspace/notes.txt", filepath.Join(dir, "back.txt")}, 0, ""},
		{"blocks refuse writes", []string{local, "s1:/blocks/notes.txt"}, exitFailed, "403"},
		{"a missing file", []string{"s1:/workspace/absent", filepath.Join(dir, "x")}, exitFailed, "404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := sandboxctl(t, "", append(append([]string{"cp"}, flags...), tc.args...)...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantErr) {
				t.Fatalf("exit %d stderr %q; want exit %d and stderr with %q", code, stderr, tc.wantCode, tc.wantErr)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(areasRoot, "ada", "workspace", "notes.txt")); err != nil || string(b) != "from the host\n" {
		t.Fatalf("the upload on the host: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "back.txt")); err != nil || string(b) != "from the host\n" {
		t.Fatalf("the download: %q, %v", b, err)
	}
}

// kubectl completes the plugin's arguments through kubectl_complete-sandbox:
// claim names for exec and mcp, CLAIM: for cp, --via's two values.
func TestCompletion(t *testing.T) {
	kc := execCluster(t)
	complete := func(args ...string) []string {
		t.Helper()
		var out, errb strings.Builder
		if code := runAs(completionPlugin, args, strings.NewReader(""), &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errb.String())
		}
		return strings.Split(strings.TrimSpace(out.String()), "\n")
	}
	if got := complete("exec", "--kubeconfig", kc, ""); !slices.Equal(got, []string{"s1", "s2", ":4"}) {
		t.Errorf("exec CLAIM: %q", got)
	}
	if got := complete("exec", "--kubeconfig", kc, "s2"); !slices.Equal(got, []string{"s2", ":4"}) {
		t.Errorf("exec s2<TAB>: %q", got)
	}
	if got := complete("cp", "notes.txt", "--kubeconfig", kc, "s"); !slices.Equal(got, []string{"s1:", "s2:", ":2"}) {
		t.Errorf("cp notes.txt s<TAB>: %q", got)
	}
	if got := complete("exec", "--via", ""); !slices.Equal(got, []string{"api-server", "node", ":4"}) {
		t.Errorf("--via: %q", got)
	}
}

func TestHelpPerVerb(t *testing.T) {
	for _, verb := range []string{"run", "serve", "convert", "ls", "cp", "exec", "mcp", "diff", "apply", "repair"} {
		var out, errb strings.Builder
		if code := runAs("kubectl-sandbox", []string{verb, "--help"}, strings.NewReader(""), &out, &errb); code != 0 {
			t.Fatalf("%s --help: exit %d: %s", verb, code, errb.String())
		}
		if !strings.Contains(out.String(), "kubectl sandbox "+verb) || !strings.Contains(out.String(), "Examples:") {
			t.Errorf("%s --help says no usage or examples under the plugin's name:\n%s", verb, out.String())
		}
	}
	var out, errb strings.Builder
	if code := run([]string{"exec", "--no-such-flag"}, strings.NewReader(""), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "--no-such-flag") {
		t.Errorf("an unknown flag: exit %d: %s", code, errb.String())
	}
	if code := run([]string{"nonsense"}, strings.NewReader(""), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), `unknown command "nonsense"`) {
		t.Errorf("an unknown verb: exit %d: %s", code, errb.String())
	}
}
