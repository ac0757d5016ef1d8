package bwrap_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/testenv"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

func TestOverlayMountKeepsTheSourceAndReportsHealth(t *testing.T) {
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (overlay mounts need CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "project")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	spec := &v1alpha1.SandboxSpec{
		Agent:    "ovl",
		Binaries: []v1alpha1.BinaryName{"sh"},
		Mounts:   []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay}},
	}
	in, err := runtimes.Describe("default/ovl", spec, runtimes.Options{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := rt.Ensure(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if st.Overlay == nil || !st.Overlay.Healthy {
		t.Fatalf("overlay health after Ensure: %+v", st.Overlay)
	}
	var out, errb bytes.Buffer
	code, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{
		Argv:   []string{"sh", "-c", "echo changed > /workspace/project/main.go && echo new > /workspace/project/new.txt && cat /workspace/project/main.go"},
		Stdout: &out, Stderr: &errb,
	})
	if err != nil || code.Code != 0 {
		t.Fatalf("exec: %v exit %d stderr %q", err, code.Code, errb.String())
	}
	if out.String() != "changed\n" {
		t.Fatalf("the sandbox does not see its own write: %q", out.String())
	}
	if b, _ := os.ReadFile(filepath.Join(src, "main.go")); string(b) != "package main\n" {
		t.Fatalf("the host source changed: %q", b)
	}
	changes, err := in.Mounts[0].Overlay.Diff()
	if err != nil || len(changes) != 2 {
		t.Fatalf("Diff = %v, %v", changes, err)
	}

	if err := rt.Stop(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if ok, _ := in.Mounts[0].Overlay.Mounted(); ok {
		t.Fatalf("overlay still mounted after Stop")
	}
	st, err = rt.Ensure(ctx, in)
	if err != nil || st.Overlay == nil || !st.Overlay.Healthy {
		t.Fatalf("Ensure after Stop: %+v, %v", st.Overlay, err)
	}
	out.Reset()
	if _, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", "cat /workspace/project/new.txt"}, Stdout: &out}); err != nil || out.String() != "new\n" {
		t.Fatalf("changes did not survive stop and start: %q, %v", out.String(), err)
	}

	// Someone unmounts the overlay behind the driver's back.
	if err := in.Mounts[0].Overlay.Unmount(); err != nil {
		t.Fatal(err)
	}
	st, err = rt.Inspect(ctx, in.Name)
	if err != nil || st.Overlay == nil || st.Overlay.Healthy || st.Overlay.Reason != v1alpha1.ReasonNotMounted {
		t.Fatalf("Inspect with the overlay unmounted: %+v, %v", st.Overlay, err)
	}
	if err := rt.Delete(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(in.Mounts[0].Overlay.Upper); err != nil {
		t.Fatalf("Delete removed the unapplied changes: %v", err)
	}
}
