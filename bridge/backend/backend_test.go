package backend_test

import (
	"flag"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	_ "github.com/cireilclaw/sandbox-controller/bridge/backend/all"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// The backends' own admission rules, with the API's messages word for
// word: api/v1alpha1's admission test checks the CEL side of each.
func TestBackendRulesSayTheAPIMessages(t *testing.T) {
	for _, tc := range []struct {
		name, field, msg string
		spec             v1alpha1.SandboxSpec
	}{
		{"backend incus without the incus table", "spec.incus", v1alpha1.MsgIncusRequired,
			v1alpha1.SandboxSpec{Backend: v1alpha1.BackendIncus}},
		{"backend incus without an image", "spec.incus", v1alpha1.MsgIncusRequired,
			v1alpha1.SandboxSpec{Backend: v1alpha1.BackendIncus, Incus: &v1alpha1.IncusSpec{Profiles: []string{}}}},
		{"backend containerd without the containerd table", "spec.containerd", v1alpha1.MsgContainerdRequired,
			v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd}},
		{"backend containerd without an image", "spec.containerd", v1alpha1.MsgContainerdRequired,
			v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: &v1alpha1.ContainerdSpec{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Agent = "alice"
			errs := backend.ValidateSpec(&spec)
			if len(errs) != 1 || errs[0].Type != field.ErrorTypeRequired || errs[0].Field != tc.field || errs[0].Detail != tc.msg {
				t.Fatalf("ValidateSpec = %v, want one: %s: Required value: %s", errs, tc.field, tc.msg)
			}
		})
	}
}

func TestBuiltInBackendsAcceptTheirSamples(t *testing.T) {
	for _, spec := range []v1alpha1.SandboxSpec{
		{Agent: "alice"},
		{Agent: "alice", Backend: v1alpha1.BackendBwrap},
		{Agent: "alice", Backend: v1alpha1.BackendContainerd, Containerd: &v1alpha1.ContainerdSpec{Image: "busybox"}},
		{Agent: "alice", Backend: v1alpha1.BackendIncus, Incus: &v1alpha1.IncusSpec{Image: "images:fedora/42"}},
	} {
		if errs := backend.ValidateSpec(&spec); len(errs) > 0 {
			t.Errorf("backend %q: %v", spec.Backend, errs)
		}
	}
}

// An unknown backend is refused with the registered names, sorted.
func TestUnknownBackendListsTheRegisteredNames(t *testing.T) {
	errs := backend.ValidateSpec(&v1alpha1.SandboxSpec{Agent: "alice", Backend: "nope"})
	if len(errs) != 1 || errs[0].Type != field.ErrorTypeNotSupported || errs[0].Field != "spec.backend" {
		t.Fatalf("ValidateSpec = %v, want one unsupported spec.backend", errs)
	}
	names := backend.Names()
	if !slices.IsSorted(names) {
		t.Fatalf("Names() = %v, not sorted", names)
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = `"` + string(n) + `"`
	}
	want := `spec.backend: Unsupported value: "nope": supported values: ` + strings.Join(quoted, ", ")
	if got := errs.ToAggregate().Error(); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	for _, b := range []v1alpha1.Backend{v1alpha1.BackendBwrap, v1alpha1.BackendContainerd, v1alpha1.BackendIncus} {
		if !slices.Contains(names, b) {
			t.Errorf("the built-in backend %s is not registered: %v", b, names)
		}
	}
}

// The API's common rules still apply, after the backend's.
func TestValidateSpecKeepsTheCommonRules(t *testing.T) {
	errs := backend.ValidateSpec(&v1alpha1.SandboxSpec{Agent: "Alice", Backend: v1alpha1.BackendContainerd})
	got := errs.ToAggregate().Error()
	for _, want := range []string{v1alpha1.MsgContainerdRequired, v1alpha1.MsgAgentLabel} {
		if !strings.Contains(got, want) {
			t.Errorf("ValidateSpec = %s, lacks %q", got, want)
		}
	}
}

func TestRegisterRefusesATakenOrEmptyName(t *testing.T) {
	for _, b := range []backend.Backend{
		{Name: v1alpha1.BackendBwrap},
		{},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", b.Name)
				}
			}()
			backend.Register(b)
		}()
	}
	none := func(*flag.FlagSet) runtimes.Constructor { return nil }
	// The toy's driver is registered (toy_test.go); the other names no
	// backend.
	for _, name := range []v1alpha1.Backend{"unregistered", toyName} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RegisterDriver(%q) did not panic", name)
				}
			}()
			backend.RegisterDriver(name, none)
		}()
	}
}

// The built-in backends' class rules, reached through the one class check
// every caller makes.
func TestBuiltInClassRules(t *testing.T) {
	class := &v1alpha1.SandboxClass{
		ObjectMeta: metav1.ObjectMeta{Name: "team"},
		Spec: v1alpha1.SandboxClassSpec{
			AllowedBackends: []v1alpha1.Backend{v1alpha1.BackendContainerd, v1alpha1.BackendIncus},
			AllowedImages:   v1alpha1.ClassImages{Containerd: []string{"registry.example.com/*"}, Incus: []string{"images:debian/12"}},
			DefaultLimits:   &v1alpha1.ClassLimits{RootfsSizeLimit: ptr.To(resource.MustParse("2Gi"))},
			MaxLimits:       &v1alpha1.ClassLimits{RootSizeLimit: ptr.To(resource.MustParse("10Gi"))},
		},
	}
	ctr := &v1alpha1.SandboxSpec{Agent: "a", Backend: v1alpha1.BackendContainerd, Containerd: &v1alpha1.ContainerdSpec{Image: "registry.example.com/x:1"}}
	out, v := sandboxclass.Effective(class, ctr, sandboxclass.Node{})
	if len(v) > 0 || out.Containerd.RootfsSizeLimit == nil || out.Containerd.RootfsSizeLimit.String() != "2Gi" {
		t.Fatalf("containerd under the class: %v, %+v; want allowed with the default rootfsSizeLimit 2Gi", v, out)
	}
	inc := &v1alpha1.SandboxSpec{Agent: "a", Backend: v1alpha1.BackendIncus,
		Incus: &v1alpha1.IncusSpec{Image: "images:fedora/42", RootSizeLimit: ptr.To(resource.MustParse("20Gi"))}}
	_, v = sandboxclass.Effective(class, inc, sandboxclass.Node{})
	want := []string{
		`spec.incus.image: SandboxClass "team" does not allow the image "images:fedora/42" (allowed: [images:debian/12])`,
		`spec.incus.rootSizeLimit: 20Gi is above the maximum 10Gi of SandboxClass "team"`,
	}
	if !slices.Equal(v, want) {
		t.Fatalf("incus under the class:\n got %q\nwant %q", v, want)
	}
}
