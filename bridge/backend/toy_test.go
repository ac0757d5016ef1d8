package backend_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The toy is a fourth backend that lives entirely in this file: the proof
// that a backend is one package and one Register line, with nothing to
// change in the API, the describe path, the class checks or the manager.
// It has no settings of its own in a spec: it runs shell scripts, in the
// bwrap driver under its own name.
const toyName v1alpha1.Backend = "toy"

const (
	msgToyShell = "backend toy runs shell scripts: spec.binaries must list sh"
	// toyBinariesAnnotation on a SandboxClass lists the binaries it allows
	// toy Sandboxes (comma-separated): the toy's own class rule, read from
	// the class's metadata since the API has no field for it.
	toyBinariesAnnotation = "toy.example/allowed-binaries"
)

// The toy's two registration lines: its backend, and its driver, as a
// program running drivers registers them.
func init() {
	backend.Register(toy())
	backend.RegisterDriver(toyName, toyFlags)
}

func toy() backend.Backend {
	return backend.Backend{Name: toyName, Validate: toyValidate, Describe: toyDescribe, Class: toyClass}
}

func toyValidate(spec *v1alpha1.SandboxSpec) field.ErrorList {
	if !slices.Contains(spec.Binaries, "sh") {
		return field.ErrorList{field.Required(field.NewPath("spec", "binaries"), msgToyShell)}
	}
	return nil
}

// toyDescribe marks the instance to stop with the controller: something
// only the toy sets, so a test sees that its part of the description ran.
func toyDescribe(_ *v1alpha1.SandboxSpec, in *runtimes.Instance) { in.StopOnExit = true }

func toyClass(class *v1alpha1.SandboxClass, spec, _ *v1alpha1.SandboxSpec) []string {
	allowed := strings.Split(class.Annotations[toyBinariesAnnotation], ",")
	var v []string
	for i, b := range spec.Binaries {
		if !slices.Contains(allowed, string(b)) {
			v = append(v, fmt.Sprintf("spec.binaries[%d]: SandboxClass %q does not allow toy Sandboxes the binary %q", i, class.Name, b))
		}
	}
	return v
}

// toyRuntime is the bwrap driver under the toy's name; it reports usage
// as the driver does.
type toyRuntime struct{ *bwrap.Runtime }

func toyFlags(fs *flag.FlagSet) runtimes.Constructor {
	var cfg bwrap.Config
	fs.BoolVar(&cfg.AllowUnlimited, "toy-allow-unlimited-sandboxes", false, "let toy Sandboxes run without resource limits where no cgroup can be made")
	return func(_ context.Context, stateDir string) (runtimes.Runtime, func(), error) {
		c := cfg
		c.StateDir = filepath.Join(stateDir, string(toyName))
		rt, err := bwrap.New(c)
		if err != nil {
			return nil, nil, err
		}
		return toyRuntime{rt}, nil, nil
	}
}

func toySpec(agent string, binaries ...v1alpha1.BinaryName) v1alpha1.SandboxSpec {
	return v1alpha1.SandboxSpec{Agent: agent, Backend: toyName, Binaries: binaries}
}

func TestToyIsRegistered(t *testing.T) {
	if _, ok := backend.Lookup(toyName); !ok || !slices.Contains(backend.Names(), toyName) {
		t.Fatalf("the toy is not registered: %v", backend.Names())
	}
}

func TestToySpecIsValidatedThroughTheRegistry(t *testing.T) {
	good := toySpec("toy-a", "sh", "cat")
	if errs := backend.ValidateSpec(&good); len(errs) > 0 {
		t.Fatalf("a valid toy spec: %v", errs)
	}
	bad := toySpec("toy-a", "cat")
	want := "spec.binaries: Required value: " + msgToyShell
	if got := backend.ValidateSpec(&bad).ToAggregate(); got == nil || got.Error() != want {
		t.Fatalf("an invalid toy spec: %v, want %s", got, want)
	}
	// The describe path refuses it with the same words.
	_, err := instance.FromSandbox(toySandbox(bad), nil, instance.Host{AreasRoot: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("describing an invalid toy spec: %v, want %q", err, want)
	}
}

func TestToyIsDescribedAndHeldToItsClass(t *testing.T) {
	host := instance.Host{AreasRoot: t.TempDir()}
	class := &v1alpha1.SandboxClass{
		ObjectMeta: metav1.ObjectMeta{Name: "toys", Labels: map[string]string{v1alpha1.DefaultClassLabel: "true"},
			Annotations: map[string]string{toyBinariesAnnotation: "sh,cat"}},
		Spec: v1alpha1.SandboxClassSpec{AllowedBackends: []v1alpha1.Backend{toyName}},
	}

	in := describe(t, toySpec("toy-b", "sh", "cat"), host, class)
	if in.Name != "cireilclaw-toy-b" || !in.StopOnExit || !slices.Equal(in.Binaries, []string{"cat", "sh"}) || in.ConfigHash == "" {
		t.Fatalf("the toy's instance: %+v", in)
	}

	sb := toySandbox(toySpec("toy-b", "sh", "rm"))
	_, _, err := sandboxclass.Describe(context.Background(), classes(t, class), sb, host)
	want := `spec.binaries[1]: SandboxClass "toys" does not allow toy Sandboxes the binary "rm"`
	var forbidden *sandboxclass.ForbiddenError
	if !errors.As(err, &forbidden) || !slices.Contains(forbidden.Violations, want) {
		t.Fatalf("a binary the class does not allow the toy: %v, want %q", err, want)
	}
}

// The shared driver specs, on instances described as the controller
// describes them, through a runtime the registry builds from its flags.
func TestToyRunsTheDriverSpecs(t *testing.T) {
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh); in CI a missing bwrap fails these tests")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (overlay mounts and cgroups need it)", "run the tests as root, as CI does")
	}
	t.Run("MountSourcesRefused", func(t *testing.T) {
		rt, host := toyDriver(t)
		runtimetest.MountSourcesRefused(t, rt, func(src string) runtimes.Instance {
			spec := toySpec("toy-src", "sh")
			spec.Mounts = []v1alpha1.Mount{{Source: src, Target: "data"}}
			return describe(t, spec, host)
		})
	})
	t.Run("OverlayMount", func(t *testing.T) {
		rt, host := toyDriver(t)
		src := runtimetest.OverlaySource(t)
		spec := toySpec("toy-ovl", "sh", "cat", "head", "rm")
		spec.Mounts = []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay, SizeLimit: ptr.To(resource.MustParse("100Ki"))}}
		runtimetest.OverlayMount(t, rt, describe(t, spec, host), src)
	})
	t.Run("Limits", func(t *testing.T) {
		rt, host := toyDriver(t)
		spec := toySpec("toy-lim", "sh", "sleep")
		spec.Resources = &v1alpha1.Resources{
			PidsLimit: ptr.To[int64](runtimetest.LimitedPids),
			Limits:    v1alpha1.ResourceAmounts{Memory: resource.NewQuantity(runtimetest.LimitedMemory, resource.BinarySI)},
		}
		in := describe(t, spec, host)
		t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
		runtimetest.Limits(t, rt, in)
	})
}

// toyDriver builds the toy's runtime as the manager does: the registered
// backend's flags bound and parsed, then its constructor.
func toyDriver(t *testing.T) (runtimes.Runtime, instance.Host) {
	t.Helper()
	flags, ok := backend.Drivers()[toyName]
	if !ok {
		t.Fatal("the toy's driver is not registered")
	}
	fs := flag.NewFlagSet("toy", flag.ContinueOnError)
	build := flags(fs)
	if err := fs.Parse([]string{"--toy-allow-unlimited-sandboxes=false"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	rt, closeRT, err := build(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	if closeRT != nil {
		t.Cleanup(closeRT)
	}
	// Before the directory goes: the driver's trees are mounts on the host.
	t.Cleanup(func() {
		if err := bwrap.DetachTrees(filepath.Join(state, string(toyName))); err != nil {
			t.Error(err)
		}
	})
	return rt, instance.Host{AreasRoot: filepath.Join(dir, "areas")}
}

// describe prepares the agent of spec and describes its Sandbox the one
// way the controller does (sandboxclass.Describe), in a cluster with the
// given classes (none: no class applies).
func describe(t *testing.T, spec v1alpha1.SandboxSpec, host instance.Host, cls ...*v1alpha1.SandboxClass) runtimes.Instance {
	t.Helper()
	if err := instance.Prepare(&spec, host); err != nil {
		t.Fatal(err)
	}
	in, _, err := sandboxclass.Describe(context.Background(), classes(t, cls...), toySandbox(spec), host)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func toySandbox(spec v1alpha1.SandboxSpec) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "toys", Name: spec.Agent}, Spec: spec}
}

// classes is a reader of a cluster holding cls.
func classes(t *testing.T, cls ...*v1alpha1.SandboxClass) client.Reader {
	t.Helper()
	scheme, err := v1alpha1.SchemeBuilder.Build()
	if err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme)
	for _, c := range cls {
		b = b.WithObjects(c.DeepCopy())
	}
	return b.Build()
}
