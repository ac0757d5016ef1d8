package execapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/frontends/mcpserver"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.next.RoundTrip(r)
}

func (f *fixture) mcpConnect(token, claim string) (*mcp.ClientSession, error) {
	hc := &http.Client{Transport: bearer{token: token, next: f.srv.Client().Transport}}
	client := mcp.NewClient(&mcp.Implementation{Name: "test-harness", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   f.srv.URL + "/api/v1alpha1/namespaces/" + ns + "/sessionclaims/" + claim + "/mcp",
		HTTPClient: hc,
	}, nil)
}

func mcpCall(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any) (bool, string, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	var out map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(b, &out)
	}
	return res.IsError, strings.Join(parts, "\n"), out
}

// A claim's sandbox as MCP tools over streamable HTTP, driven by the MCP
// Go SDK's client: the tools say what the sandbox offers, a command runs,
// one outside the allowlist is a tool error, a file goes in and comes
// back, and a caller without exec and file rights is refused.
func TestMCPOverHTTP(t *testing.T) {
	f := newFixture(t, Config{})
	s, err := f.mcpConnect("alice-token", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var execDesc string
	for _, tl := range tools.Tools {
		if tl.Name == "exec" {
			execDesc = tl.Description
		}
	}
	if !strings.Contains(execDesc, "cat, echo, fail") || !strings.Contains(execDesc, "/workspace/docs (ro)") {
		t.Errorf("exec's description does not say what the sandbox offers: %q", execDesc)
	}

	isErr, txt, out := mcpCall(t, s, "exec", map[string]any{"argv": []string{"echo", "hi"}})
	if isErr || out["stdout"] != "hi\n" || out["exit_code"] != float64(0) {
		t.Fatalf("exec echo: %v %q %v", isErr, txt, out)
	}
	if isErr, txt, _ = mcpCall(t, s, "exec", map[string]any{"argv": []string{"curl", "x"}}); !isErr || !strings.Contains(txt, "refused") || !strings.Contains(txt, "curl") {
		t.Fatalf("a command outside the allowlist: %v %q", isErr, txt)
	}
	if got := f.rt.commands(); strings.Contains(strings.Join(got, ";"), "curl") {
		t.Fatalf("the refused command reached the runtime: %v", got)
	}
	if isErr, txt, _ = mcpCall(t, s, "write_file", map[string]any{"path": "/workspace/mcp/a.txt", "content": "from mcp\n"}); isErr {
		t.Fatalf("write_file: %q", txt)
	}
	if isErr, txt, out = mcpCall(t, s, "read_file", map[string]any{"path": "/workspace/mcp/a.txt"}); isErr || out["content"] != "from mcp\n" {
		t.Fatalf("read_file: %v %q %v", isErr, txt, out)
	}
	if isErr, _, _ = mcpCall(t, s, "write_file", map[string]any{"path": "/workspace/docs/x", "content": "x"}); !isErr {
		t.Error("write_file into a read-only mount was not refused")
	}

	for _, c := range []struct{ who, token string }{{"bob (files get only)", "bob-token"}, {"no credentials", ""}, {"unknown token", "nobody"}} {
		if s, err := f.mcpConnect(c.token, "s1"); err == nil {
			s.Close()
			t.Errorf("%s: connected", c.who)
		}
	}
	if s, err := f.mcpConnect("alice-token", "waiting"); err == nil {
		s.Close()
		t.Error("a claim whose Sandbox is not Ready: connected")
	}
}

// A claim with a worktree also gets git_status and git_diff, which run git
// in the worktree through the sandbox (the allowlist applies); a claim
// without one does not.
func TestMCPGitToolsForAWorktreeClaim(t *testing.T) {
	f := newFixture(t, Config{})
	names := func(claim string) []string {
		s, err := f.mcpConnect("alice-token", claim)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tools, err := s.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tl := range tools.Tools {
			out = append(out, tl.Name)
		}
		return out
	}
	if got := names("s1"); slices.Contains(got, "git_status") {
		t.Errorf("a claim without a worktree has git tools: %v", got)
	}
	if got := names("wt"); !slices.Contains(got, "git_status") || !slices.Contains(got, "git_diff") {
		t.Fatalf("a worktree claim's tools: %v", got)
	}
	s, err := f.mcpConnect("alice-token", "wt")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wt := "/workspace/project/.worktrees/wt"
	if isErr, txt, out := mcpCall(t, s, "git_status", map[string]any{}); isErr || out["output"] != "ran in "+wt+": status --short --branch\n" {
		t.Fatalf("git_status: %v %q %v", isErr, txt, out)
	}
	if isErr, txt, out := mcpCall(t, s, "git_diff", map[string]any{"staged": true, "path": "-x"}); isErr || out["output"] != "ran in "+wt+": diff --staged -- -x\n" {
		t.Fatalf("git_diff: %v %q %v", isErr, txt, out)
	}
}

// What a file holds and what a command prints are the agent's to choose,
// and an answer costs the server many times its bytes (a control byte is
// six in JSON, and the SDK sends a result twice). read_file reads no more
// than it answers, and both tools answer at most a megabyte of content.
func TestMCPBoundsWhatItAnswers(t *testing.T) {
	f := newFixture(t, Config{})
	// 16 MiB of control bytes, the most a whole read of the areas takes.
	if err := os.MkdirAll(f.workspace(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.workspace(), "noise"), bytes.Repeat([]byte{1}, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := f.mcpConnect("alice-token", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	allocated := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.TotalAlloc
	}

	before := allocated()
	isErr, txt, out := mcpCall(t, s, "read_file", map[string]any{"path": "/workspace/noise", "max_bytes": 64 << 20})
	grew := allocated() - before
	content, _ := out["content"].(string)
	if isErr || len(content) != mcpserver.MaxReadBytes || out["truncated"] != true {
		t.Fatalf("read_file of 16 MiB asking for 64: error %v, %d bytes, truncated %v; want the first %d bytes and truncated", isErr, len(content), out["truncated"], mcpserver.MaxReadBytes)
	}
	if len(txt) > 16<<20 || grew > 512<<20 {
		t.Fatalf("read_file answered %d bytes of text and allocated %d MiB", len(txt), grew>>20)
	}
	if _, _, out := mcpCall(t, s, "read_file", map[string]any{"path": "/workspace/noise"}); len(out["content"].(string)) != mcpserver.DefaultReadBytes {
		t.Fatalf("read_file without max_bytes: %d bytes, want %d", len(out["content"].(string)), mcpserver.DefaultReadBytes)
	}

	// cat prints its stdin: 3 MiB (within the 4 MiB a request may carry),
	// asking to keep 16.
	before = allocated()
	isErr, txt, out = mcpCall(t, s, "exec", map[string]any{"argv": []string{"cat"}, "stdin": strings.Repeat("a", 3<<20), "max_output_bytes": 16 << 20})
	grew = allocated() - before
	stdout, _ := out["stdout"].(string)
	if isErr || len(stdout) != mcpserver.MaxOutput || out["truncated"] != true {
		t.Fatalf("exec printing 3 MiB: error %v, %d bytes, truncated %v; want %d and truncated", isErr, len(stdout), out["truncated"], mcpserver.MaxOutput)
	}
	if len(txt) > 16<<20 || grew > 512<<20 {
		t.Fatalf("exec answered %d bytes of text and allocated %d MiB", len(txt), grew>>20)
	}
}

// mcpRequest is alice's MCP request of body to claim's endpoint, with the
// headers the streamable HTTP transport sends.
func (f *fixture) mcpRequest(claim string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/"+claim+"/mcp", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer alice-token")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	return req, nil
}

// mcpPost sends body to a claim's MCP endpoint as a client that names no
// protocol version, and returns the status and at most limit bytes of the
// answer with the answer's whole length.
func (f *fixture) mcpPost(claim, body string, limit int64) (int, string, int64) {
	f.t.Helper()
	req, err := f.mcpRequest(claim, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var kept bytes.Buffer
	n, _ := io.Copy(&kept, io.LimitReader(resp.Body, limit))
	rest, _ := io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, kept.String(), n + rest
}

// A JSON-RPC batch runs its calls at once and is answered when the last
// is done, every answer held until then: a few hundred kilobytes of calls
// to read_file made the controller hold and send gigabytes. A request is
// one message; a batch is refused before any of its calls runs.
func TestMCPRefusesABatchOfCalls(t *testing.T) {
	f := newFixture(t, Config{})
	if err := os.MkdirAll(f.workspace(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.workspace(), "noise"), bytes.Repeat([]byte{1}, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	call := func(id int, tool, args string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, tool, args)
	}
	var calls []string
	for i := range 8 {
		calls = append(calls, call(i+1, "read_file", `{"path":"/workspace/noise","max_bytes":1048576}`))
	}
	calls = append(calls, call(9, "exec", `{"argv":["echo","from a batch"]}`))
	code, answer, size := f.mcpPost("s1", " \n["+strings.Join(calls, ",")+"]", 4096)
	if code != http.StatusBadRequest || !strings.Contains(answer, "batch") || size > 64<<10 {
		t.Fatalf("a batch of 8 read_file calls and an exec: %d, %d bytes answered: %.300q; want 400 saying a batch is refused", code, size, answer)
	}
	if got := f.rt.commands(); slices.Contains(got, "echo from a batch") {
		t.Fatalf("a call of the refused batch ran: %v", got)
	}
	// One message, whitespace before it and all, is served.
	code, answer, _ = f.mcpPost("s1", "\n\t "+call(1, "exec", `{"argv":["echo","alone"]}`), 64<<10)
	if code != http.StatusOK || !strings.Contains(answer, `alone\n`) {
		t.Fatalf("one call: %d %.300q", code, answer)
	}
}

// An answer stays in the controller's memory until its client takes it:
// read_file's megabyte of control bytes is about 13 MB of JSON. A tool
// gave its slot of the claim's limit back when it returned, before its
// answer was sent, so clients that never read their answers held as many
// of them as they asked for. A tool's slot is now held until its answer
// has been sent: a client that does not read keeps it.
// unreadAnswer makes a megabyte of control bytes in the workspace and
// returns a transport whose clients cannot take an answer in (smallBuffers)
// and the body of a read_file call of it: an answer of some 13 MB.
func (f *fixture) unreadAnswer(t *testing.T) (*http.Transport, string) {
	t.Helper()
	if err := os.MkdirAll(f.workspace(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.workspace(), "noise"), bytes.Repeat([]byte{1}, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return f.smallBuffers(t, false), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"/workspace/noise","max_bytes":1048576}}}`
}

func TestMCPAnswersNotTakenKeepTheirSlots(t *testing.T) {
	f := newFixture(t, Config{MaxExecsPerClaim: 2})
	// A client that reads the headers of an answer and nothing more, with
	// a receive buffer too small to take the answer in.
	tr, body := f.unreadAnswer(t)
	for range f.api.cfg.MaxExecsPerClaim {
		req, err := f.mcpRequest("s1", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		// The answer has begun: the tool has returned.
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("read_file: %d", resp.StatusCode)
		}
		defer resp.Body.Close()
	}

	s, err := f.mcpConnect("alice-token", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"read_file", map[string]any{"path": "/workspace/noise", "max_bytes": 1 << 20}},
		{"exec", map[string]any{"argv": []string{"echo", "one more"}}},
	} {
		if isErr, txt, out := mcpCall(t, s, c.tool, c.args); !isErr || !strings.Contains(txt, "already runs 2") {
			t.Fatalf("%s while 2 answers of the claim's limit of 2 are not taken: error %v, %.200q, %d bytes of content; want it refused", c.tool, isErr, txt, len(fmt.Sprint(out)))
		}
	}
}

// The claim's limit bounds the answers held for one claim, but a tenant
// makes claims at will, as many as it likes on one Sandbox: answers not
// taken (about 13 MB each) were held as many times as its claims times
// the limit. An MCP request is answered as a download is, holding one of
// the namespace's download slots (three quarters of --api-max-downloads)
// until its answer has been sent.
func TestMCPAnswersNotTakenAreBoundedAcrossClaims(t *testing.T) {
	f := newFixture(t, Config{MaxExecsPerClaim: 2, MaxDownloads: 4})
	tr, body := f.unreadAnswer(t)
	claims := []string{"s1"}
	for i := range 3 {
		c := &v1alpha1.SessionClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("more-%d", i)},
			Spec:       v1alpha1.SessionClaimSpec{SandboxName: "ada"},
		}
		if err := f.client.Create(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		c.Status.Conditions = []metav1.Condition{condition(v1alpha1.ConditionBound, true)}
		if err := f.client.Status().Update(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		claims = append(claims, c.Name)
	}
	held, refused := 0, 0
	for _, claim := range claims {
		for range f.api.cfg.MaxExecsPerClaim {
			req, err := f.mcpRequest(claim, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				held++
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Fatalf("read_file through claim %s: %d", claim, resp.StatusCode)
			}
		}
	}
	// The namespace's share of 4 download slots is 3.
	if held != 3 || refused != len(claims)*f.api.cfg.MaxExecsPerClaim-3 {
		t.Fatalf("answers not taken through %d claims of one Sandbox: %d held, %d refused; want 3 held (the namespace's share of --api-max-downloads) and the rest refused", len(claims), held, refused)
	}
}

// An MCP request's body is read into memory (up to 4 MiB) before any tool
// runs, and nothing bounded how many bodies were arriving at once: a
// caller that sent most of a body and stalled held its megabytes for as
// long as it liked, as many times as it liked. A body arriving takes an
// upload slot (--api-max-uploads, of which one namespace may hold three
// quarters) until it is whole.
func TestMCPBodiesArrivingTakeUploadSlots(t *testing.T) {
	f := newFixture(t, Config{MaxUploads: 4})
	// A client whose send buffer is small: a megabyte of body has left it
	// only once the server has read most of it.
	tr := f.smallBuffers(t, true)
	post := func(body io.Reader) (int, string) {
		req, err := f.mcpRequest("s1", body)
		if err != nil {
			return 0, err.Error()
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode, string(b)
	}
	var stalled []*io.PipeWriter
	t.Cleanup(func() {
		for _, pw := range stalled {
			pw.CloseWithError(errors.New("the test is over"))
		}
	})
	for range 3 {
		pr, pw := io.Pipe()
		stalled = append(stalled, pw)
		go post(pr)
		head := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"/workspace/big","content":"`
		if _, err := pw.Write([]byte(head + strings.Repeat("a", 1<<20))); err != nil {
			t.Fatal(err)
		}
	}
	code, msg := post(strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":{"argv":["echo","fourth"]}}}`))
	if code != http.StatusTooManyRequests || !strings.Contains(msg, "uploads in progress") {
		t.Fatalf("a fourth MCP request while three bodies of the namespace stall: %d %.300q; want 429", code, msg)
	}
	if got := f.rt.commands(); slices.Contains(got, "echo fourth") {
		t.Fatalf("the refused request ran its command: %v", got)
	}
	for _, pw := range stalled {
		pw.CloseWithError(errors.New("the test is over"))
	}
	testenv.Eventually(t, time.Minute, "the stalled bodies' slots come back", func() bool {
		code, _ := post(strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":{"argv":["echo","fifth"]}}}`))
		return code == http.StatusOK
	})
}

// A directory's names are the agent's: 20,000 empty files whose names are
// 255 control bytes each cost it nothing, and each byte is six in JSON and
// seven more in the text the SDK sends beside it. list_directory answers
// at most mcpserver.MaxListEntries entries and says when there are more.
func TestMCPListBoundsWhatItAnswers(t *testing.T) {
	f := newFixture(t, Config{})
	dir := filepath.Join(f.workspace(), "crowd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 20_000 {
		name := fmt.Sprintf("%05d", i) + strings.Repeat("\x01", 250)
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := f.mcpConnect("alice-token", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	isErr, txt, out := mcpCall(t, s, "list_directory", map[string]any{"path": "/workspace/crowd"})
	entries, _ := out["entries"].([]any)
	if isErr || len(entries) != mcpserver.MaxListEntries || out["truncated"] != true {
		t.Fatalf("list_directory of 20,000 entries: error %v, %d entries, truncated %v; want %d and truncated", isErr, len(entries), out["truncated"], mcpserver.MaxListEntries)
	}
	if len(txt) > 16<<20 {
		t.Fatalf("list_directory answered %d bytes of text", len(txt))
	}
	if _, _, out := mcpCall(t, s, "list_directory", map[string]any{"path": "/workspace"}); out["truncated"] != false {
		t.Fatalf("a small directory's listing: %v", out)
	}
}

// A client that stops reading its answer holds its tool's slot only until
// a write of the answer has waited its deadline: then the answer is given
// up and the slot comes back, as a download's file does.
func TestMCPAnswersNotTakenGiveTheirSlotsBackAtTheDeadline(t *testing.T) {
	f := newFixture(t, Config{MaxExecsPerClaim: 1})
	f.api.downloadWriteTimeout = time.Second
	tr, body := f.unreadAnswer(t)
	req, err := f.mcpRequest("s1", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// The client would give up after five minutes; the slot must come
	// back long before.
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("read_file: %d", resp.StatusCode)
	}

	s, err := f.mcpConnect("alice-token", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testenv.Eventually(t, 30*time.Second, "the slot of an answer its client stopped reading came back", func() bool {
		isErr, _, _ := mcpCall(t, s, "exec", map[string]any{"argv": []string{"echo", "one more"}})
		return !isErr
	})
}

// A failure of the runtime that is no refusal reaches the model as its
// reason and an id: the runtime's own words may name host paths, which
// the node's log keeps.
func TestMCPToolsNameNoHostPathOfARuntimeFailure(t *testing.T) {
	f := newFixture(t, Config{})
	s, err := f.mcpConnect("alice-token", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	isErr, txt, _ := mcpCall(t, s, "exec", map[string]any{"argv": []string{"broken"}})
	if !isErr || strings.Contains(txt, "/var/lib") || !regexp.MustCompile(`failed \(RuntimeError\); the node's log has why, under failure [0-9a-f]{12}`).MatchString(txt) {
		t.Fatalf("a runtime failure: error %v, %q", isErr, txt)
	}
}
