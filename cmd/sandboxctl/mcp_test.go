package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMain lets a test start this test binary as sandboxctl itself, so an
// MCP client drives a real process over its stdin and stdout.
func TestMain(m *testing.M) {
	if os.Getenv("SANDBOXCTL_TEST_AS_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// mcpSession starts `sandboxctl mcp` as a process and connects the MCP Go
// SDK's client to it over stdio.
func mcpSession(t *testing.T, args ...string) *mcp.ClientSession {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append([]string{"mcp"}, args...)...)
	cmd.Env = append(os.Environ(), "SANDBOXCTL_TEST_AS_MAIN=1")
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "test-harness", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func call(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	var out map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(b, &out)
	}
	return res, out
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// An MCP client sees the sandbox's tools with what the sandbox offers, runs
// a command, is refused one the policy does not allow (as a tool error in
// the policy's words), writes a file and reads it back, and cannot reach a
// read-only area or leave the sandbox.
func TestMCPOverStdio(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\", \"cat\"]\n")
	s := mcpSession(t, "--config", cfg, "--agent", "mcp", "--areas-root", filepath.Join(dir, "areas"))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	for _, tl := range tools.Tools {
		byName[tl.Name] = tl
	}
	for _, name := range []string{"exec", "read_file", "write_file", "list_directory", "remove"} {
		if byName[name] == nil {
			t.Fatalf("tool %s is not listed: %v", name, tools.Tools)
		}
	}
	if d := byName["exec"].Description; !strings.Contains(d, "cat, sh") || !strings.Contains(d, "/workspace (rw)") || !strings.Contains(d, "/blocks (ro)") {
		t.Errorf("exec's description does not say what the sandbox offers: %q", d)
	}

	res, out := call(t, s, "exec", map[string]any{"argv": []string{"sh", "-c", "echo hello; echo oops >&2; cat; exit 3"}, "stdin": "from stdin\n"})
	if res.IsError || out["exit_code"] != float64(3) || out["stdout"] != "hello\nfrom stdin\n" || out["stderr"] != "oops\n" {
		t.Fatalf("exec: error %v %q, %v", res.IsError, text(res), out)
	}
	res, out = call(t, s, "exec", map[string]any{"argv": []string{"sh", "-c", "head -c 100000 /dev/zero 2>/dev/null || i=0; while [ $i -lt 5000 ]; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"}, "max_output_bytes": 1000})
	if res.IsError || out["truncated"] != true || len(out["stdout"].(string)) != 1000 {
		t.Fatalf("exec with an output cap: error %v %q, truncated %v, %d bytes", res.IsError, text(res), out["truncated"], len(out["stdout"].(string)))
	}

	res, _ = call(t, s, "exec", map[string]any{"argv": []string{"curl", "http://example.com"}})
	if !res.IsError || !strings.Contains(text(res), "refused") || !strings.Contains(text(res), "curl") {
		t.Fatalf("a command not allowed: error %v, %q", res.IsError, text(res))
	}
	res, _ = call(t, s, "exec", map[string]any{"argv": []string{"sh", "-c", "while :; do :; done"}, "timeout_seconds": 1})
	if !res.IsError || !strings.Contains(text(res), "killed after") {
		t.Fatalf("a command over its timeout: error %v, %q", res.IsError, text(res))
	}

	res, _ = call(t, s, "write_file", map[string]any{"path": "/workspace/notes/todo.txt", "content": "write tests\n"})
	if res.IsError {
		t.Fatalf("write_file: %q", text(res))
	}
	res, out = call(t, s, "read_file", map[string]any{"path": "/workspace/notes/todo.txt"})
	if res.IsError || out["content"] != "write tests\n" {
		t.Fatalf("read_file: %q, %v", text(res), out)
	}
	res, out = call(t, s, "exec", map[string]any{"argv": []string{"cat", "/workspace/notes/todo.txt"}})
	if res.IsError || out["stdout"] != "write tests\n" {
		t.Fatalf("the command does not see the written file: %q, %v", text(res), out)
	}
	res, out = call(t, s, "list_directory", map[string]any{"path": "/workspace/notes"})
	if res.IsError || !strings.Contains(text(res), "todo.txt") {
		t.Fatalf("list_directory: %q, %v", text(res), out)
	}
	if res, _ = call(t, s, "write_file", map[string]any{"path": "/blocks/x", "content": "x"}); !res.IsError {
		t.Error("write_file into the read-only /blocks was not refused")
	}
	if res, _ = call(t, s, "read_file", map[string]any{"path": "/etc/passwd"}); !res.IsError {
		t.Errorf("read_file outside the sandbox's places: %q", text(res))
	}
	if res, _ = call(t, s, "remove", map[string]any{"path": "/workspace/notes", "recursive": true}); res.IsError {
		t.Fatalf("remove: %q", text(res))
	}
	if _, err := os.Stat(filepath.Join(dir, "areas", "mcp", "workspace", "notes")); !os.IsNotExist(err) {
		t.Errorf("remove left the directory: %v", err)
	}
}

// kubectl sandbox mcp CLAIM serves the claim's tools on stdio, each call
// forwarded to the claim's MCP endpoint of the exec API with the exec
// API's credentials (never the kubeconfig's token, which execCluster
// fails the test on).
func TestMCPBridgeToAClaim(t *testing.T) {
	kc := execCluster(t)
	s := mcpSession(t, append(execFlags(kc), "s1")...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 5 || !strings.Contains(tools.Tools[0].Description+tools.Tools[1].Description, "cat, echo, fail") {
		t.Fatalf("the claim's tools: %+v", tools.Tools)
	}
	res, out := call(t, s, "exec", map[string]any{"argv": []string{"echo", "through", "the", "bridge"}})
	if res.IsError || out["stdout"] != "through the bridge\n" {
		t.Fatalf("exec: %v %q %v", res.IsError, text(res), out)
	}
	if res, _ = call(t, s, "exec", map[string]any{"argv": []string{"rm", "-rf", "/"}}); !res.IsError || !strings.Contains(text(res), "refused") {
		t.Fatalf("a command outside the allowlist: %v %q", res.IsError, text(res))
	}
	if res, _ = call(t, s, "write_file", map[string]any{"path": "/workspace/b.txt", "content": "bridged\n"}); res.IsError {
		t.Fatalf("write_file: %q", text(res))
	}
	if res, out = call(t, s, "read_file", map[string]any{"path": "/workspace/b.txt"}); res.IsError || out["content"] != "bridged\n" {
		t.Fatalf("read_file: %q %v", text(res), out)
	}
}
