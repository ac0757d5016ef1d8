// Package runtimetest holds driver tests every backend runs the same way.
// It is test code: only *_test.go files import it.
package runtimetest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/overlay"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// T is what the tests need of *testing.T, so Ginkgo suites can run them
// through GinkgoT().
type T interface {
	Helper()
	Log(args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	TempDir() string
}

// OverlaySource makes a host directory with one file, main.go, for an
// overlay mount to cover.
func OverlaySource(t T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "project")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// OverlayMount drives an instance whose spec mounts src at "project" with
// mode overlay and a sizeLimit of 100Ki (in.Mounts[0]), and "sh" allowed,
// through a driver: the sandbox sees its writes and the source does not;
// a write beyond the limit fails (the upper layer is on a file system of
// that size) and the health stays Healthy; Stop unmounts the merged view; the changes survive a stop and
// start; Delete keeps them.
func OverlayMount(t T, rt runtimes.Runtime, in runtimes.Instance, src string) {
	t.Helper()
	ctx := context.Background()
	// The agent writes through the merged view with its own host id, so
	// the source must be the agent's to change, as a rw mount's would be.
	giveTo(t, in.Identity.UID, src)
	layers := in.Mounts[0].Overlay
	if layers == nil || layers.SizeLimit != 100*1024 {
		t.Fatalf("the instance's first mount is not an overlay with a 100Ki limit: %+v", in.Mounts)
	}
	run := func(script string) string {
		t.Helper()
		var out, errb bytes.Buffer
		st, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec %q: %v exit %d stderr %q", script, err, st.Code, errb.String())
		}
		return out.String()
	}
	health := func(want runtimes.Reason) {
		t.Helper()
		st, err := rt.Inspect(ctx, in.Name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Overlay == nil || st.Overlay.Reason != want || st.Overlay.Healthy != (want == runtimes.ReasonHealthy) {
			t.Fatalf("overlay health = %+v, want reason %v", st.Overlay, want)
		}
	}

	if _, err := rt.Ensure(ctx, in); err != nil {
		t.Fatal(err)
	}
	health(runtimes.ReasonHealthy)
	if out := run("echo changed > /workspace/project/main.go && echo new > /workspace/project/new.txt && cat /workspace/project/main.go"); out != "changed\n" {
		t.Fatalf("the sandbox does not see its own write: %q", out)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "main.go")); string(b) != "package main\n" {
		t.Fatalf("the host source changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(src, "new.txt")); err == nil {
		t.Fatal("a file made inside appeared in the host source")
	}
	changes, err := layers.Diff()
	if err != nil || len(changes) != 2 {
		t.Fatalf("Diff = %v, %v", changes, err)
	}

	t.Log("a write beyond the size limit fails, and fills nothing but the overlay's own file system")
	out := run("head -c 20971520 /dev/zero > /workspace/project/big 2>/dev/null; echo $?")
	fi, err := os.Stat(filepath.Join(layers.Upper, "big"))
	if strings.TrimSpace(out) == "0" || err != nil || fi.Size() > layers.SizeLimit {
		t.Fatalf("20 MiB written into an overlay with a 100Ki limit: exit %q, %+v, %v (want a failed write of at most %d bytes)", out, fi, err, layers.SizeLimit)
	}
	health(runtimes.ReasonHealthy)
	run("rm /workspace/project/big")
	health(runtimes.ReasonHealthy)

	t.Log("stop unmounts, start mounts again with the changes")
	if err := rt.Stop(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if ok, _ := layers.Mounted(); ok {
		t.Fatal("overlay still mounted after Stop")
	}
	if _, err := rt.Ensure(ctx, in); err != nil {
		t.Fatal(err)
	}
	health(runtimes.ReasonHealthy)
	if out := run("cat /workspace/project/new.txt"); out != "new\n" {
		t.Fatalf("changes did not survive stop and start: %q", out)
	}

	if err := rt.Delete(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if ok, _ := layers.Mounted(); ok {
		t.Fatal("overlay still mounted after Delete")
	}
	changes, err = layers.Diff()
	_ = layers.Unmount() // Diff mounted the sized file system again
	if err != nil || !slices.ContainsFunc(changes, func(c overlay.Change) bool { return c.Path == "new.txt" }) {
		t.Fatalf("Delete lost the unapplied changes: %+v, %v", changes, err)
	}
}

func giveTo(t T, id uint32, root string) {
	t.Helper()
	if err := testenv.ChownTree(root, id, id); err != nil {
		t.Fatalf("giving %s to the agent's id %d: %v", root, id, err)
	}
}
