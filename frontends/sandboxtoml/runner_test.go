package sandboxtoml

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest/inside"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// source is a Source whose configuration the test replaces.
type source struct {
	mu   sync.Mutex
	snap Snapshot
}

func (s *source) Current() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

func (s *source) set(spec *v1alpha1.SandboxSpec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snap = Snapshot{Spec: spec, Generation: s.snap.Generation + 1}
}

// noRuntime is a driver that ensures every instance and runs nothing:
// the runner's own work is what is tested.
type noRuntime struct{ runtimes.Runtime }

func (noRuntime) Ensure(_ context.Context, in runtimes.Instance) (runtimes.State, error) {
	return runtimes.State{Name: in.Name, Exists: true, Running: true, ConfigHash: in.ConfigHash}, nil
}

func (noRuntime) Stop(context.Context, string) error { return nil }

func (noRuntime) Exec(context.Context, string, runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	return runtimes.ExitStatus{}, nil
}

// A configuration reloaded from an allowlist to egress None releases the
// proxy the runner served, and what it had open ends with it: left
// serving, it would take a command that names it (HTTPS_PROXY set by
// hand; a command started under the allowlist stays in its namespace) to
// the old list (found by review).
func TestReloadToNoEgressReleasesTheProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need CAP_SYS_ADMIN: run the tests as root (make test does in CI)")
	}
	srv, err := inside.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	networks := &egress.Networks{Dir: filepath.Join(dir, "netns"), Resolver: srv.Resolver()}
	host := instance.Host{AreasRoot: filepath.Join(dir, "areas"), NetnsDir: networks.Dir, EgressNets: []string{inside.ServerNet}}
	src := &source{}
	allowlist := &v1alpha1.SandboxSpec{Agent: "ada", Network: &v1alpha1.Network{
		Egress: v1alpha1.EgressAllowlist,
		Allow:  []v1alpha1.EgressRule{{Host: inside.Host, Ports: []int32{int32(srv.Port())}}},
	}}
	src.set(allowlist)
	r := NewRunner(src, noRuntime{}, v1alpha1.BackendBwrap, host)
	r.Networks = networks
	// Before the directory goes, whatever the test found.
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	if _, err := r.Exec(context.Background(), runtimes.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	nsPath := filepath.Join(networks.Dir, v1alpha1.InstanceName("ada"))
	through, err := inside.Enter(nsPath, srv)
	if err != nil {
		t.Fatal(err)
	}
	defer through.Close()
	tunnel, err := through.Tunnel()
	if err != nil {
		t.Fatalf("under the allowlist: %v", err)
	}
	defer tunnel.Close()
	if err := through.Get(); err != nil {
		t.Fatalf("under the allowlist: %v", err)
	}

	none := allowlist.DeepCopy()
	none.Network = &v1alpha1.Network{Egress: v1alpha1.EgressNone}
	src.set(none)
	if _, err := r.Exec(context.Background(), runtimes.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if err := through.Get(); err == nil {
		t.Error("with egress None, the proxy inside the sandbox's namespace still serves the old allowlist")
	}
	if err := tunnel.Get(); err == nil {
		t.Error("with egress None, a tunnel opened under the allowlist still reaches its host")
	}
	if _, err := os.Stat(nsPath); !os.IsNotExist(err) {
		t.Errorf("the namespace's file is still there: %v", err)
	}
}
