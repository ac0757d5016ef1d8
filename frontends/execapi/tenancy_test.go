package execapi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/tenancy"
)

// The areas of an agent belong to the namespace that first used them. A
// claim that says it is Bound (a lagging status, or one written by hand)
// on a Sandbox of another namespace naming that agent still reaches
// nothing: every request checks the record first.
func TestAnotherNamespacesAgentIsRefused(t *testing.T) {
	f := newFixture(t, Config{})
	ws := filepath.Join(f.areas, f.agent, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "plan.txt"), []byte("team a's plan"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tenancy.Bind(f.areas, f.agent, "team-a"); err != nil {
		t.Fatal(err)
	}
	const want = `belong to namespace "team-a"`

	for _, tc := range []struct{ name, method, path, body string }{
		{"read a file", "GET", "workspace/plan.txt", ""},
		{"list an area", "GET", "workspace", ""},
		{"overwrite a file", "PUT", "workspace/plan.txt", "overwritten"},
		{"delete a file", "DELETE", "workspace/plan.txt", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, got := f.do(tc.method, "alice-token", tc.path, strings.NewReader(tc.body))
			if code != 409 || !strings.Contains(got, want) || strings.Contains(got, "team a's plan") {
				t.Fatalf("%s %s: got %d %q, want 409 saying %q", tc.method, tc.path, code, got, want)
			}
		})
	}
	t.Run("exec", func(t *testing.T) {
		res := f.exec(context.Background(), "alice-token", "s1", nil, "echo", "hi")
		if res.err == nil || !strings.Contains(res.err.Error(), want) {
			t.Fatalf("exec: got %v, want a refusal saying %q", res.err, want)
		}
		if cmds := f.rt.commands(); len(cmds) != 0 {
			t.Errorf("nothing should have run, the runtime saw %v", cmds)
		}
	})
	if b, err := os.ReadFile(filepath.Join(ws, "plan.txt")); err != nil || string(b) != "team a's plan" {
		t.Errorf("team a's file: %q, %v", b, err)
	}
}
