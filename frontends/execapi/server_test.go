package execapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const ns = "team"

// otherNS is another tenant's namespace.
const otherNS = "other-team"

// inNamespace is o moved to namespace n.
func inNamespace[T client.Object](n string, o T) T {
	o.SetNamespace(n)
	return o
}

// fakeRuntime runs a few scripted commands in process, so the server is
// tested without a sandbox.
type fakeRuntime struct {
	runtimes.Runtime
	mu     sync.Mutex
	ran    []string
	killed chan string
}

func (f *fakeRuntime) Exec(ctx context.Context, name string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	f.mu.Lock()
	f.ran = append(f.ran, strings.Join(req.Argv, " "))
	f.mu.Unlock()
	switch req.Argv[0] {
	case "echo":
		fmt.Fprintln(req.Stdout, strings.Join(req.Argv[1:], " "))
		fmt.Fprintln(req.Stderr, "to stderr")
		return runtimes.ExitStatus{}, nil
	case "fail":
		return runtimes.ExitStatus{Code: 3}, nil
	case "cat":
		_, err := io.Copy(req.Stdout, req.Stdin)
		return runtimes.ExitStatus{}, err
	case "git":
		// git -C WORKTREE status|diff ...: says where it ran and what.
		fmt.Fprintf(req.Stdout, "ran in %s: %s\n", req.Argv[2], strings.Join(req.Argv[3:], " "))
		return runtimes.ExitStatus{}, nil
	case "broken":
		// As a driver says it could not read its own state.
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonFailed, "reading state of", name, "/var/lib/sandbox-controller/bwrap/%s.json is corrupt", name)
	case "sleep":
		<-ctx.Done()
		f.killed <- strings.Join(req.Argv, " ")
		return runtimes.ExitStatus{Code: 137}, nil
	}
	return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonRefused, "running a command in", name, "unexpected %q", req.Argv[0])
}

func (f *fakeRuntime) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ran...)
}

// fakeAuthorizer allows "user verb subresource" triples.
type fakeAuthorizer map[string]bool

func (a fakeAuthorizer) Authorize(_ context.Context, at kubeauth.Attributes) (bool, string, error) {
	if at.Resource == "sessionclaims" && at.Group == v1alpha1.GroupVersion.Group &&
		(at.Namespace == ns && a[at.User.Name+" "+at.Verb+" "+at.Subresource] ||
			a[at.Namespace+"/"+at.User.Name+" "+at.Verb+" "+at.Subresource]) {
		return true, "", nil
	}
	return false, "no RBAC rule allows it", nil
}

type fixture struct {
	t       *testing.T
	srv     *httptest.Server
	api     *Server
	rt      *fakeRuntime
	reg     *prometheus.Registry
	agent   string
	areas   string
	roMount string
	client  client.Client
}

func condition(typ string, ok bool) metav1.Condition {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: st, Reason: "Test", Message: "set by the test", LastTransitionTime: metav1.Now()}
}

// worktreeClaim is a Bound claim of sb whose worktree the controller made.
func worktreeClaim(name, sb string) *v1alpha1.SessionClaim {
	return &v1alpha1.SessionClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.SessionClaimSpec{SandboxName: sb, Worktree: &v1alpha1.WorktreeSpec{Repository: "/workspace/project"}},
		Status: v1alpha1.SessionClaimStatus{Conditions: []metav1.Condition{condition(v1alpha1.ConditionBound, true)},
			Worktree: &v1alpha1.WorktreeStatus{Path: "/workspace/project/.worktrees/" + name}},
	}
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	f := &fixture{t: t, rt: &fakeRuntime{killed: make(chan string, 4)}, reg: prometheus.NewRegistry(), agent: "ada", areas: t.TempDir(), roMount: t.TempDir()}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	sandbox := func(name string, ready bool) *v1alpha1.Sandbox {
		return &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.SandboxSpec{
				Agent:    name,
				Binaries: []v1alpha1.BinaryName{"echo", "fail", "cat", "sleep", "missing", "git", "broken"},
				Mounts:   []v1alpha1.Mount{{Source: f.roMount, Target: "docs", Mode: v1alpha1.MountReadOnly}},
			},
			Status: v1alpha1.SandboxStatus{Conditions: []metav1.Condition{condition(v1alpha1.ConditionReady, ready)}},
		}
	}
	claim := func(name, sb string, bound bool) *v1alpha1.SessionClaim {
		return &v1alpha1.SessionClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.SessionClaimSpec{SandboxName: sb},
			Status:     v1alpha1.SessionClaimStatus{Conditions: []metav1.Condition{condition(v1alpha1.ConditionBound, bound)}},
		}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		sandbox("ada", true), claim("s1", "ada", true),
		claim("unbound", "ada", false),
		sandbox("sleepy", false), claim("waiting", "sleepy", true),
		worktreeClaim("wt", "ada"),
		sandbox("fresh", true), claim("f1", "fresh", true),
		inNamespace(otherNS, sandbox("bea", true)), inNamespace(otherNS, claim("o1", "bea", true)),
	).WithStatusSubresource(&v1alpha1.Sandbox{}, &v1alpha1.SessionClaim{}).Build()
	// The Sandbox reconciler prepares an agent (its id and areas); ada's
	// is, fresh's is not yet.
	if err := instance.Prepare(&sandbox("ada", true).Spec, instance.Host{AreasRoot: f.areas, Home: "/nonexistent"}); err != nil {
		t.Fatal(err)
	}
	// Another tenant's agent, for what one namespace may not take from
	// the others.
	if err := instance.Prepare(&sandbox("bea", true).Spec, instance.Host{AreasRoot: f.areas, Home: "/nonexistent"}); err != nil {
		t.Fatal(err)
	}

	tokens := map[string]string{"alice-token": "alice", "bob-token": "bob", "carol-token": "carol"}
	authn := kubeauth.TokenFunc(func(_ context.Context, tok string) (*kubeauth.User, bool, error) {
		u, ok := tokens[tok]
		if !ok {
			return nil, false, errors.New("unknown token")
		}
		return &kubeauth.User{Name: u}, true, nil
	})
	authz := fakeAuthorizer{"alice create exec": true, "alice get files": true, "alice update files": true, "bob get files": true,
		// carol is another tenant's: she may change files in her own
		// namespace only.
		otherNS + "/carol update files": true}
	s, err := New(cfg, Options{
		Reader:     c,
		Runtimes:   map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: f.rt},
		Host:       instance.Host{AreasRoot: f.areas, Home: "/nonexistent"},
		Auth:       Auth{Authenticator: authn, Authorizer: authz},
		Registerer: f.reg,
		Log:        logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.api, f.client = s, c
	f.srv = httptest.NewTLSServer(s.Handler())
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) config(token string) *rest.Config {
	return &rest.Config{Host: f.srv.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

func (f *fixture) refusals(reason string) float64 {
	return testutil.ToFloat64(mustCounter(f.t, f.reg, "sandbox_execapi_refusals_total", reason))
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				v = m.GetCounter().GetValue()
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "value"})
	g.Set(v)
	return g
}

// execResult is what a client saw of one command.
type execResult struct {
	stdout, stderr string
	err            error
}

func (f *fixture) exec(ctx context.Context, token, claim string, stdin io.Reader, argv ...string) execResult {
	f.t.Helper()
	q := url.Values{"stdout": {"true"}, "stderr": {"true"}, "command": argv}
	if stdin != nil {
		q.Set("stdin", "true")
	}
	u := f.srv.URL + "/api/v1alpha1/namespaces/" + ns + "/sessionclaims/" + claim + "/exec?" + q.Encode()
	e, err := remotecommand.NewWebSocketExecutor(f.config(token), "GET", u)
	if err != nil {
		// Error, not Fatal: exec also runs on goroutines of its own.
		f.t.Error(err)
		return execResult{err: err}
	}
	// A cancelled stream returns while client-go may still be copying.
	var out, errb lockedBuffer
	err = e.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: &out, Stderr: &errb})
	return execResult{stdout: out.String(), stderr: errb.String(), err: err}
}

func TestExecStreamsOutputAndExitCode(t *testing.T) {
	f := newFixture(t, Config{})
	ctx := context.Background()

	res := f.exec(ctx, "alice-token", "s1", nil, "echo", "hello", "world")
	if res.err != nil || res.stdout != "hello world\n" || res.stderr != "to stderr\n" {
		t.Fatalf("echo: got stdout %q stderr %q err %v", res.stdout, res.stderr, res.err)
	}
	res = f.exec(ctx, "alice-token", "s1", nil, "fail")
	var code exec.CodeExitError
	if !errors.As(res.err, &code) || code.Code != 3 {
		t.Fatalf("fail: want exit code 3, got %v", res.err)
	}
	res = f.exec(ctx, "alice-token", "s1", strings.NewReader("from stdin\n"), "cat")
	if res.err != nil || res.stdout != "from stdin\n" {
		t.Fatalf("cat: got stdout %q err %v", res.stdout, res.err)
	}
}

func TestExecRefusals(t *testing.T) {
	f := newFixture(t, Config{})
	ctx := context.Background()
	tests := []struct {
		name, token, claim string
		argv               []string
		want               string
		reason             string
	}{
		{"no credentials", "", "s1", []string{"echo"}, "anonymous requests are refused", refusalUnauthenticated},
		{"unknown token", "nobody", "s1", []string{"echo"}, "authentication failed", refusalUnauthenticated},
		{"user without sessionclaims/exec", "bob-token", "s1", []string{"echo"}, `user "bob" cannot create resource "sessionclaims/exec"`, refusalForbidden},
		{"command not on the allowlist", "alice-token", "s1", []string{"rm", "-rf", "/"}, `command refused: command "rm" is not in the sandbox's binaries allowlist`, refusalCommandRefused},
		{"shell metacharacter", "alice-token", "s1", []string{"echo;id"}, "command refused", refusalCommandRefused},
		{"claim not bound", "alice-token", "unbound", []string{"echo"}, "is not Bound", refusalNotReady},
		{"sandbox not ready", "alice-token", "waiting", []string{"echo"}, "is not Ready", refusalNotReady},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := f.refusals(tc.reason)
			res := f.exec(ctx, tc.token, tc.claim, nil, tc.argv...)
			if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, res.err)
			}
			if got := f.refusals(tc.reason); got != before+1 {
				t.Errorf("refusals{reason=%s}: got %v, want %v", tc.reason, got, before+1)
			}
		})
	}
	for _, c := range f.rt.commands() {
		if !strings.HasPrefix(c, "echo") || strings.Contains(c, ";") {
			t.Errorf("a refused command reached the runtime: %q", c)
		}
	}
	if n := len(f.rt.commands()); n != 0 {
		t.Errorf("nothing should have run, the runtime saw %v", f.rt.commands())
	}
}

// A claim's Ready is written beside its Sandbox's, so a client that saw
// the claim Ready may ask before the Sandbox's Ready is in the server's
// cache: the request waits for it. A Sandbox that stopped being Ready
// after the claim became Ready is refused at once.
func TestExecWaitsForASandboxReadyBesideItsClaim(t *testing.T) {
	f := newFixture(t, Config{})
	ctx := context.Background()
	claimReady := time.Now().Truncate(time.Second)
	mk := func(name string, sandboxReady metav1.Time) {
		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.SandboxSpec{Agent: "ada", Binaries: []v1alpha1.BinaryName{"echo"}},
		}
		cl := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-claim"}, Spec: v1alpha1.SessionClaimSpec{SandboxName: name}}
		for _, o := range []client.Object{sb, cl} {
			if err := f.client.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		sb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonStopped, Message: "stopped", LastTransitionTime: sandboxReady}}
		cl.Status.Conditions = []metav1.Condition{
			{Type: v1alpha1.ConditionBound, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBound, Message: "bound", LastTransitionTime: metav1.NewTime(claimReady)},
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonSandboxReady, Message: "running", LastTransitionTime: metav1.NewTime(claimReady)},
		}
		for _, o := range []client.Object{sb, cl} {
			if err := f.client.Status().Update(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("starting", metav1.NewTime(claimReady.Add(-time.Minute)))
	mk("stopped-since", metav1.NewTime(claimReady.Add(time.Second)))

	done := make(chan execResult, 1)
	go func() { done <- f.exec(ctx, "alice-token", "starting-claim", nil, "echo", "hello") }()
	select {
	case res := <-done:
		t.Fatalf("the request did not wait for the Sandbox's Ready: %+v", res)
	case <-time.After(200 * time.Millisecond):
	}
	var sb v1alpha1.Sandbox
	if err := f.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "starting"}, &sb); err != nil {
		t.Fatal(err)
	}
	sb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunning, Message: "running", LastTransitionTime: metav1.Now()}}
	if err := f.client.Status().Update(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.err != nil || res.stdout != "hello\n" {
		t.Fatalf("once the Sandbox is Ready the command runs: got stdout %q err %v", res.stdout, res.err)
	}

	start := time.Now()
	res := f.exec(ctx, "alice-token", "stopped-since-claim", nil, "echo", "hello")
	if res.err == nil || !strings.Contains(res.err.Error(), "is not Ready") {
		t.Fatalf("a Sandbox that stopped after its claim was Ready: want a refusal, got %v", res.err)
	}
	if waited := time.Since(start); waited >= sandboxCatchUp {
		t.Errorf("the refusal waited %v for a Sandbox that stopped after its claim", waited)
	}
}

func TestExecCancelKillsTheCommand(t *testing.T) {
	f := newFixture(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan execResult, 1)
	go func() { done <- f.exec(ctx, "alice-token", "s1", nil, "sleep", "1000") }()
	testenv.Eventually(t, 10*time.Second, "the command started", func() bool { return len(f.rt.commands()) > 0 })
	cancel()
	select {
	case got := <-f.rt.killed:
		if got != "sleep 1000" {
			t.Fatalf("killed %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling the client did not cancel the command")
	}
	<-done
}

func TestExecTimeoutKillsTheCommand(t *testing.T) {
	f := newFixture(t, Config{ExecTimeout: 200 * time.Millisecond})
	res := f.exec(context.Background(), "alice-token", "s1", nil, "sleep", "1000")
	if res.err == nil || !strings.Contains(res.err.Error(), "exec timeout") {
		t.Fatalf("want the exec timeout, got %v", res.err)
	}
	<-f.rt.killed
}

func TestExecLimitPerClaim(t *testing.T) {
	f := newFixture(t, Config{MaxExecsPerClaim: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.exec(ctx, "alice-token", "s1", nil, "sleep", "1")
	testenv.Eventually(t, 10*time.Second, "the first command started", func() bool { return len(f.rt.commands()) > 0 })
	res := f.exec(context.Background(), "alice-token", "s1", nil, "echo")
	if res.err == nil || !strings.Contains(res.err.Error(), "the most one claim may run at once") {
		t.Fatalf("want the per-claim limit, got %v", res.err)
	}
	cancel()
	<-f.rt.killed
}

func (f *fixture) do(method, token, p string, body io.Reader) (int, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/"+p, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st metav1.Status
	if resp.Header.Get("Content-Type") == "application/json" && json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
		return resp.StatusCode, st.Message
	}
	return resp.StatusCode, string(b)
}

func TestFiles(t *testing.T) {
	f := newFixture(t, Config{MaxBodyBytes: 1 << 10})
	if err := os.WriteFile(filepath.Join(f.roMount, "readme"), []byte("read only"), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name, method, token, path, body string
		code                            int
		contains                        string
	}{
		{"write a file", "PUT", "alice-token", "workspace/notes/a.txt", "hello", 404, "no such file"},
		{"make a directory", "PUT", "alice-token", "workspace/notes?directory=true", "", 201, ""},
		{"write into it", "PUT", "alice-token", "workspace/notes/a.txt", "hello", 204, ""},
		{"read it back", "GET", "alice-token", "workspace/notes/a.txt", "", 200, "hello"},
		{"head", "HEAD", "alice-token", "workspace/notes/a.txt", "", 200, ""},
		{"list the directory", "GET", "alice-token", "workspace/notes", "", 200, `"name":"a.txt"`},
		{"reader may read", "GET", "bob-token", "workspace/notes/a.txt", "", 200, "hello"},
		{"reader may not write", "PUT", "bob-token", "workspace/notes/b.txt", "x", 403, `cannot update resource "sessionclaims/files"`},
		{"no credentials", "GET", "", "workspace/notes/a.txt", "", 401, "anonymous requests are refused"},
		{"blocks are read-only", "PUT", "alice-token", "blocks/x", "x", 403, "read-only"},
		{"read-only mount refuses writes", "PUT", "alice-token", "workspace/docs/readme", "x", 403, "read-only"},
		{"read-only mount refuses deletes", "DELETE", "alice-token", "workspace/docs/readme", "", 403, "read-only"},
		{"read-only mount reads", "GET", "alice-token", "workspace/docs/readme", "", 200, "read only"},
		{"unknown area", "GET", "alice-token", "etc/passwd", "", 404, "no area"},
		{"too large", "PUT", "alice-token", "workspace/big", strings.Repeat("x", 2<<10), 413, "limit"},
		{"delete", "DELETE", "alice-token", "workspace/notes/a.txt", "", 204, ""},
		{"deleted", "GET", "alice-token", "workspace/notes/a.txt", "", 404, ""},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			var body io.Reader
			if st.body != "" {
				body = strings.NewReader(st.body)
			}
			code, got := f.do(st.method, st.token, st.path, body)
			if code != st.code || !strings.Contains(got, st.contains) {
				t.Fatalf("%s %s: got %d %q, want %d containing %q", st.method, st.path, code, got, st.code, st.contains)
			}
		})
	}

	t.Run("symlink escape", func(t *testing.T) {
		ws := filepath.Join(f.areas, f.agent, "workspace")
		if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
			t.Fatal(err)
		}
		before := f.refusals(refusalEscape)
		for _, m := range []string{"GET", "PUT"} {
			code, got := f.do(m, "alice-token", "workspace/out/secret", strings.NewReader("overwritten"))
			if code != 403 || strings.Contains(got, outside) {
				t.Fatalf("%s through an escaping link: got %d %q, want 403 without the host path", m, code, got)
			}
		}
		if got := f.refusals(refusalEscape); got != before+2 {
			t.Errorf("escape refusals: got %v, want %v", got, before+2)
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
			t.Errorf("the file outside was changed: %q", b)
		}
	})

	t.Run("mount points are not removable, whatever links lead there", func(t *testing.T) {
		ws := filepath.Join(f.areas, f.agent, "workspace")
		// The mount point of workspace/docs, as the driver's mount tree
		// leaves it in the area, and what an agent adds: l -> .
		if err := os.MkdirAll(filepath.Join(ws, "docs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(".", filepath.Join(ws, "l")); err != nil {
			t.Fatal(err)
		}
		before := f.refusals(refusalMountPoint)
		code, got := f.do("DELETE", "alice-token", "workspace/l/docs?recursive=true", nil)
		if code != 409 || !strings.Contains(got, "/workspace/docs") {
			t.Fatalf("removing a mount point through a link: got %d %q, want 409 naming /workspace/docs", code, got)
		}
		code, got = f.do("DELETE", "alice-token", "workspace/l?recursive=true", nil)
		if code != 204 {
			t.Fatalf("removing the link itself: got %d %q, want 204", code, got)
		}
		if _, err := os.Stat(filepath.Join(ws, "docs")); err != nil {
			t.Fatalf("removing the link removed its target: %v", err)
		}
		if got := f.refusals(refusalMountPoint); got != before+1 {
			t.Errorf("mount point refusals: got %v, want %v", got, before+1)
		}
	})

	t.Run("listing is JSON entries", func(t *testing.T) {
		code, got := f.do("GET", "alice-token", "workspace/docs", nil)
		var entries []map[string]any
		if code != 200 || json.Unmarshal([]byte(got), &entries) != nil || len(entries) != 1 || entries[0]["name"] != "readme" {
			t.Fatalf("got %d %q", code, got)
		}
	})
}

// lockedBuffer is a buffer safe to read while client-go still writes to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A request never creates, renames or chowns anything for an agent: the
// Sandbox reconciler prepares it (instance.Prepare). Until it has, the
// agent's files and commands are refused, and its directory stays absent.
func TestRequestsCreateNothingForAnAgent(t *testing.T) {
	f := newFixture(t, Config{})
	for _, p := range []string{"workspace", "workspace/notes.txt"} {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/f1/files/"+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice-token")
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || !strings.Contains(string(b), "not prepared on this node yet") {
			t.Errorf("GET %s of an agent not prepared: %d %s", p, resp.StatusCode, b)
		}
	}
	res := f.exec(context.Background(), "alice-token", "f1", nil, "echo", "hi")
	if res.err == nil || !strings.Contains(res.err.Error(), "not prepared on this node yet") {
		t.Errorf("exec in an agent not prepared: %v", res.err)
	}
	if _, err := os.Lstat(filepath.Join(f.areas, "fresh")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the requests made the agent's directory: %v", err)
	}
}

// A kept-alive connection that sends no next request is closed: before,
// anyone who could reach the port held connections open forever after one
// answer, unauthenticated (a 401 will do).
func TestIdleConnectionsAreClosed(t *testing.T) {
	f := newFixture(t, Config{BindAddress: "127.0.0.1:0"})
	cert := f.srv.TLS.Certificates[0]
	f.api.opts.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }
	f.api.idleTimeout = time.Second
	addr, err := f.api.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.api.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("the server's end: %v", err)
		}
	})

	conn, err := tls.Dial("tcp", addr.String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/workspace HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a request without credentials: %d", resp.StatusCode)
	}
	// The connection is now idle, and kept alive by the server.
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("an idle connection after a refused request: %v; want it closed by the server (EOF)", err)
	}
}

// A refusal is logged with what the caller sent: its path may be a
// megabyte, and anyone may send one.
func TestRefusalsLogABoundedLine(t *testing.T) {
	f := newFixture(t, Config{})
	var longest int
	var mu sync.Mutex
	f.api.log = funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		longest = max(longest, len(prefix)+len(args))
	}, funcr.Options{})
	name := strings.Repeat("n", 256<<10)
	req, err := http.NewRequest("GET", f.srv.URL+"/api/v1alpha1/namespaces/team/sessionclaims/"+name+"/files/workspace", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a request without credentials: %s, want 401", resp.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	if longest == 0 || longest > 8<<10 {
		t.Fatalf("the longest log line of a refusal of a %d-byte path is %d bytes, want some and at most 8 KiB", len(name), longest)
	}
}
