package execapi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
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

// The file endpoints do not wait for Ready, so they serve only a Sandbox
// the controller admitted: not one being deleted, not one its class
// forbids (as its status says; the class itself is checked again too).
func TestFilesServeOnlyAdmittedSandboxes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, f *fixture, sb *v1alpha1.Sandbox)
		want   string
	}{
		{"forbidden by its class", func(t *testing.T, f *fixture, sb *v1alpha1.Sandbox) {
			sb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonClassForbids, Message: `spec.mounts[0].source: "/etc" lies outside`, LastTransitionTime: metav1.Now()}}
			if err := f.client.Status().Update(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
		}, "forbids its spec"},
		{"being deleted", func(t *testing.T, f *fixture, sb *v1alpha1.Sandbox) {
			sb.Finalizers = []string{"test.sandbox.cireilclaw.dev/hold"}
			if err := f.client.Update(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			if err := f.client.Delete(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
		}, "is being deleted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Config{})
			ws := filepath.Join(f.areas, f.agent, "workspace")
			if err := os.MkdirAll(ws, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ws, "plan.txt"), []byte("the plan"), 0o644); err != nil {
				t.Fatal(err)
			}
			if code, got := f.do("GET", "alice-token", "workspace/plan.txt", nil); code != 200 {
				t.Fatalf("before: %d %q, want the file", code, got)
			}
			var sb v1alpha1.Sandbox
			if err := f.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: f.agent}, &sb); err != nil {
				t.Fatal(err)
			}
			tc.change(t, f, &sb)
			for _, m := range []string{"GET", "PUT", "DELETE"} {
				code, got := f.do(m, "alice-token", "workspace/plan.txt", strings.NewReader("overwritten"))
				if code != 409 || !strings.Contains(got, tc.want) || strings.Contains(got, "the plan") {
					t.Fatalf("%s: got %d %q, want 409 saying %q", m, code, got, tc.want)
				}
			}
			if b, err := os.ReadFile(filepath.Join(ws, "plan.txt")); err != nil || string(b) != "the plan" {
				t.Fatalf("the file: %q %v", b, err)
			}
		})
	}
}
