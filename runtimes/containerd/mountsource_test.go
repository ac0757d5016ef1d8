package containerd_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
)

// The check runs on the host before the daemon is asked anything, so this
// test needs no containerd: the socket named here does not exist.
func TestEnsureRefusesMountSourcesABindCannotUse(t *testing.T) {
	dir := t.TempDir()
	rt, err := containerd.New(context.Background(), containerd.Config{Address: filepath.Join(dir, "no-containerd.sock")})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.MountSourcesRefused(t, rt, func(src string) runtimes.Instance {
		spec := &v1alpha1.SandboxSpec{Agent: "src", Backend: v1alpha1.BackendContainerd, Binaries: []v1alpha1.BinaryName{"true"},
			Containerd: &v1alpha1.ContainerdSpec{Image: "example.invalid/never-pulled:1"},
			Mounts:     []v1alpha1.Mount{{Source: src, Target: "data"}}}
		in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
		if err != nil {
			t.Fatal(err)
		}
		return in
	})
}
