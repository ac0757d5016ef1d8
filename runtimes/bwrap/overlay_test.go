package bwrap_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func overlayInstance(t *testing.T) (*bwrap.Runtime, runtimes.Instance, string) {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (overlay mounts need CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	src := runtimetest.OverlaySource(t)
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	spec := &v1alpha1.SandboxSpec{
		Agent:    "ovl",
		Binaries: []v1alpha1.BinaryName{"sh", "cat", "head", "rm"},
		Mounts: []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay,
			SizeLimit: ptr.To(resource.MustParse("100Ki"))}},
	}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	return rt, in, src
}

func TestOverlayMount(t *testing.T) {
	rt, in, src := overlayInstance(t)
	runtimetest.OverlayMount(t, rt, in, src)
}

func TestOverlayUnmountedBehindTheDriversBackIsNotMounted(t *testing.T) {
	rt, in, _ := overlayInstance(t)
	ctx := context.Background()
	if _, err := rt.Ensure(ctx, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(ctx, in.Name) })
	if err := in.Mounts[0].Overlay.Unmount(); err != nil {
		t.Fatal(err)
	}
	st, err := rt.Inspect(ctx, in.Name)
	if err != nil || st.Overlay == nil || st.Overlay.Healthy || st.Overlay.Reason != runtimes.ReasonNotMounted {
		t.Fatalf("Inspect with the overlay unmounted: %+v, %v", st.Overlay, err)
	}
}
