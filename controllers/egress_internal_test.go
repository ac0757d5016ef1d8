package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/record"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest/inside"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The proxies' decisions are counted under at most maxEgressHosts host
// labels per Sandbox, and a denied host is told in an Event at most once
// per egressDenialEvery.
func TestEgressWatchBoundsLabelsAndEvents(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := record.NewFakeRecorder(1000)
	w := &egressWatch{recorder: rec, now: func() time.Time { return now }, owners: map[string]*egressOwner{}}
	sb := &v1alpha1.Sandbox{}
	sb.Namespace, sb.Name, sb.UID = "team-a", "bounded", "uid-1"
	w.own("cireilclaw-bounded", sb)

	for i := range maxEgressHosts + 10 {
		w.decide("cireilclaw-bounded", egress.Decision{Host: fmt.Sprintf("h%d.example.com", i), Port: 443, Reason: "not listed"})
	}
	if got := testutil.ToFloat64(egressConnections.WithLabelValues("team-a", "bounded", "other", "denied")); got != 10 {
		t.Errorf("hosts past the bound counted as other: %v, want 10", got)
	}
	if got := testutil.ToFloat64(egressConnections.WithLabelValues("team-a", "bounded", "h0.example.com", "denied")); got != 1 {
		t.Errorf("h0.example.com denied: %v, want 1", got)
	}

	events := func() int {
		n := 0
		for {
			select {
			case <-rec.Events:
				n++
			default:
				return n
			}
		}
	}
	events()
	for range 5 {
		w.decide("cireilclaw-bounded", egress.Decision{Host: "h1.example.com", Port: 443, Reason: "not listed"})
	}
	if n := events(); n != 0 {
		t.Errorf("%d Events for a host denied again within a minute, want none", n)
	}
	now = now.Add(egressDenialEvery)
	w.decide("cireilclaw-bounded", egress.Decision{Host: "h1.example.com", Port: 443, Reason: "not listed"})
	w.decide("cireilclaw-bounded", egress.Decision{Host: "h1.example.com", Port: 443, Allowed: true})
	if n := events(); n != 1 {
		t.Errorf("%d Events a minute later, want 1", n)
	}
	if got := testutil.ToFloat64(egressConnections.WithLabelValues("team-a", "bounded", "h1.example.com", "allowed")); got != 1 {
		t.Errorf("h1.example.com allowed: %v, want 1", got)
	}

	w.forget("cireilclaw-bounded")
	if got := testutil.CollectAndCount(egressConnections); got != 0 {
		t.Errorf("%d series left of a forgotten Sandbox", got)
	}
	w.decide("cireilclaw-bounded", egress.Decision{Host: "late.example.com", Reason: "not listed"})
	if n := events(); n != 0 {
		t.Errorf("an Event for a forgotten Sandbox")
	}
}

// A Sandbox whose egress goes from Allowlist to None has its proxy
// released on the next pass, and what the proxy had open ends with it:
// left serving, it would take a command that names it (HTTPS_PROXY set by
// hand; an Incus container, a bwrap command started under the allowlist,
// stay in its namespace) to the old list (found by review).
func TestServeNetworkReleasesAProxyNoLongerWanted(t *testing.T) {
	r, s, through := servedAllowlist(t, nil)
	name := s.instance.Name
	networks := r.Networks
	tunnel, err := through.Tunnel()
	if err != nil {
		t.Fatalf("under the allowlist: %v", err)
	}
	defer tunnel.Close()

	s.instance.Network = nil
	if err := r.serveNetwork(context.Background(), s, false); err != nil {
		t.Fatal(err)
	}
	if err := through.Get(); err == nil {
		t.Error("with egress None, the proxy inside the Sandbox's namespace still serves the old allowlist")
	}
	if err := tunnel.Get(); err == nil {
		t.Error("with egress None, a tunnel opened under the allowlist still reaches its host")
	}
	if _, err := os.Stat(filepath.Join(networks.Dir, name)); !os.IsNotExist(err) {
		t.Errorf("the namespace's file is still there: %v", err)
	}
}

// notRunning is a runtime whose instances exist nowhere: stopForbidden
// asks it no more than Inspect.
type notRunning struct{ runtimes.Runtime }

func (notRunning) Inspect(context.Context, string) (runtimes.State, error) {
	return runtimes.State{}, nil
}

// A Sandbox its class comes to forbid has its proxy released with its
// instance stopped: the proxy serves a list the class no longer allows.
func TestStopForbiddenReleasesTheProxy(t *testing.T) {
	r, s, through := servedAllowlist(t, notRunning{})
	if err := r.stopForbidden(context.Background(), s, "its class changed"); err != nil {
		t.Fatal(err)
	}
	if err := through.Get(); err == nil {
		t.Error("the proxy of a Sandbox its class forbids still serves its allowlist")
	}
}

// servedAllowlist is a reconciler serving an allowlist for Sandbox
// team-a/ada of agent ada (rt its runtime), and a client inside the
// Sandbox's namespace that reaches the allowed server through it.
func servedAllowlist(t *testing.T, rt runtimes.Runtime) (*SandboxReconciler, *sandboxScope, *inside.Through) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need CAP_SYS_ADMIN: run the tests as root (make test does in CI)")
	}
	srv, err := inside.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	networks := &egress.Networks{Dir: t.TempDir(), Resolver: srv.Resolver()}
	t.Cleanup(func() { networks.Close() })
	name := v1alpha1.InstanceName("ada")
	// Before the directory goes, whatever the test found.
	t.Cleanup(func() { _ = networks.Release(name) })
	rec := record.NewFakeRecorder(100)
	r := &SandboxReconciler{
		Options:  Options{Networks: networks},
		Recorder: rec,
		egress:   &egressWatch{recorder: rec, now: time.Now, owners: map[string]*egressOwner{}},
	}
	sb := &v1alpha1.Sandbox{}
	sb.Namespace, sb.Name, sb.UID, sb.Spec.Agent = "team-a", "ada", "uid-1", "ada"
	s := &sandboxScope{sb: sb, rt: rt, instance: runtimes.Instance{Name: name, Network: &runtimes.Network{
		Namespace:   filepath.Join(networks.Dir, name),
		Proxy:       egress.ProxyURL,
		Allow:       []runtimes.EgressRule{{Host: inside.Host, Ports: []int{srv.Port()}}},
		AllowedNets: []string{inside.ServerNet},
	}}}
	if err := r.serveNetwork(context.Background(), s, false); err != nil {
		t.Fatal(err)
	}
	through, err := inside.Enter(s.instance.Network.Namespace, srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { through.Close() })
	if err := through.Get(); err != nil {
		t.Fatalf("under the allowlist: %v", err)
	}
	return r, s, through
}

// A pass that stops before the instance is ensured (a mount source gone,
// a name conflict) still releases the proxy of a Sandbox whose egress is
// no longer an allowlist: the phase right after describe does.
func TestAPassThatStopsEarlyReleasesAProxyNoLongerWanted(t *testing.T) {
	r, s, through := servedAllowlist(t, nil)
	s.instance.Network = nil
	if stop, err := r.releaseUnwantedNetwork(context.Background(), s); stop || err != nil {
		t.Fatalf("the phase stopped the pass (%v) or failed: %v", stop, err)
	}
	if err := through.Get(); err == nil {
		t.Error("with egress None, the proxy still serves the old allowlist after the pass's first phases")
	}
}
