package bwrap_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func TestEnsureRefusesMountSourcesABindCannotUse(t *testing.T) {
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := t.TempDir()
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	var last runtimes.Instance
	runtimetest.MountSourcesRefused(t, rt, func(src string) runtimes.Instance {
		spec := &v1alpha1.SandboxSpec{Agent: "src", Binaries: []v1alpha1.BinaryName{"true"},
			Mounts: []v1alpha1.Mount{{Source: src, Target: "data"}}}
		in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
		if err != nil {
			t.Fatal(err)
		}
		last = in
		return in
	})
	// Nothing recorded: no instance that looks running and takes no command.
	st, err := rt.Inspect(context.Background(), last.Name)
	if err != nil || st.Exists {
		t.Fatalf("Inspect after the refused Ensures: %+v, %v; want no instance", st, err)
	}
}
