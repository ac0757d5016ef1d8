package incus_test

import (
	"path/filepath"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
)

// The check runs on the host before incusd is asked anything, so this test
// needs no daemon: the socket named here does not exist.
func TestEnsureRefusesMountSourcesABindCannotUse(t *testing.T) {
	dir := t.TempDir()
	rt, err := incus.New(incus.Config{Socket: filepath.Join(dir, "no-incus.sock"), DefaultProject: "default"})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.MountSourcesRefused(t, rt, func(src string) runtimes.Instance {
		spec := &v1alpha1.SandboxSpec{Agent: "src", Backend: v1alpha1.BackendIncus, Binaries: []v1alpha1.BinaryName{"true"},
			Incus:  &v1alpha1.IncusSpec{Image: "images:never/fetched"},
			Mounts: []v1alpha1.Mount{{Source: src, Target: "data"}}}
		in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
		if err != nil {
			t.Fatal(err)
		}
		return in
	})
}
