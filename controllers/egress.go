package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// egressConnections counts the requests of the Sandboxes' proxies, by
// Sandbox, host and decision. Hosts are bounded per Sandbox (maxEgressHosts,
// then "other"): a wildcard rule, or an agent trying names, must not grow
// the metrics without end.
var egressConnections = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "sandbox_egress_connections_total",
	Help: "Connections a Sandbox's egress proxy allowed or denied, by host (at most 64 hosts per Sandbox, then \"other\").",
}, []string{"namespace", "sandbox", "host", "decision"})

// maxEgressHosts bounds the host label values of one Sandbox.
const maxEgressHosts = 64

// egressDenialEvery is how often at most a denial of one host is told in
// an Event, per Sandbox.
const egressDenialEvery = time.Minute

var registerEgressMetrics = sync.OnceValue(func() error {
	return crmetrics.Registry.Register(egressConnections)
})

// egressWatch hears every proxy's decisions: it counts them and tells the
// Sandbox of denials in Events, at most one per host and minute.
type egressWatch struct {
	recorder record.EventRecorder
	now      func() time.Time

	mu     sync.Mutex
	owners map[string]*egressOwner
}

// egressOwner is the Sandbox an instance's proxy serves.
type egressOwner struct {
	sb        *v1alpha1.Sandbox
	hosts     map[string]bool
	lastEvent map[string]time.Time
}

// own says which Sandbox the proxy of instance name serves.
func (w *egressWatch) own(name string, sb *v1alpha1.Sandbox) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := w.owners[name]; ok && o.sb.UID == sb.UID {
		return
	}
	ref := &v1alpha1.Sandbox{}
	ref.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Sandbox"))
	ref.Namespace, ref.Name, ref.UID = sb.Namespace, sb.Name, sb.UID
	w.owners[name] = &egressOwner{sb: ref, hosts: map[string]bool{}, lastEvent: map[string]time.Time{}}
}

// forget drops instance name's Sandbox and its counters.
func (w *egressWatch) forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := w.owners[name]; ok {
		egressConnections.DeletePartialMatch(prometheus.Labels{"namespace": o.sb.Namespace, "sandbox": o.sb.Name})
		delete(w.owners, name)
	}
}

// decide is the proxies' OnDecision.
func (w *egressWatch) decide(name string, d egress.Decision) {
	w.mu.Lock()
	o, ok := w.owners[name]
	if !ok {
		w.mu.Unlock()
		return
	}
	host := d.Host
	if host == "" {
		host = "none"
	}
	if !o.hosts[host] {
		if len(o.hosts) >= maxEgressHosts {
			host = "other"
		} else {
			o.hosts[host] = true
		}
	}
	decision := "denied"
	if d.Allowed {
		decision = "allowed"
	}
	egressConnections.WithLabelValues(o.sb.Namespace, o.sb.Name, host, decision).Inc()
	tell := false
	if !d.Allowed {
		now := w.now()
		if last, seen := o.lastEvent[host]; !seen || now.Sub(last) >= egressDenialEvery {
			o.lastEvent[host] = now
			tell = true
		}
	}
	sb := o.sb
	w.mu.Unlock()
	if tell {
		target := d.Host
		if d.Port != 0 {
			target = fmt.Sprintf("%s:%d", d.Host, d.Port)
		}
		w.recorder.Eventf(sb, "Warning", v1alpha1.ReasonEgressDenied, "egress to %q denied: %s (further denials of this host are counted in sandbox_egress_connections_total, told again after %s)", target, d.Reason, egressDenialEvery)
	}
}

// serveNetwork makes sure the instance's proxy serves the Sandbox's
// allowlist, in the network namespace the instance runs in. Before the
// instance is started (started false), a namespace of the controller's
// own is made for drivers that join one; after it (started true), the
// proxy is opened in the namespace of a driver whose instances keep their
// own (runtimes.NetnsReporter). Both run on every pass, an adopted
// instance's included, so a restarted controller serves its proxies again.
// A Sandbox whose egress is no longer an allowlist has the proxy this
// process served for it released: left serving, it would take a command
// that names it (HTTPS_PROXY set by hand) to the old list.
func (r *SandboxReconciler) serveNetwork(ctx context.Context, s *sandboxScope, started bool) error {
	n := s.instance.Network
	if n == nil {
		_, err := r.releaseUnwantedNetwork(ctx, s)
		return err
	}
	if r.Networks == nil || r.egress == nil {
		return fmt.Errorf("spec.network.egress: Allowlist needs a network namespace of its own, which this controller does not make")
	}
	rep, reports := s.rt.(runtimes.NetnsReporter)
	own := reports && rep.OwnNetwork()
	if own != started {
		return nil
	}
	pol, err := instance.EgressPolicy(n)
	if err != nil {
		return err
	}
	r.egress.own(s.instance.Name, s.sb)
	if own {
		ns, err := rep.NetworkNamespace(ctx, s.instance.Name)
		if err == nil {
			err = r.Networks.ServeIn(s.instance.Name, s.sb.Namespace, ns, pol)
			ns.Close()
		}
		if err != nil {
			return fmt.Errorf("serving the egress proxy of %s: %w", s.instance.Name, err)
		}
		return nil
	}
	path, err := r.Networks.Serve(s.instance.Name, s.sb.Namespace, pol)
	if err != nil {
		return fmt.Errorf("serving the egress proxy of %s: %w", s.instance.Name, err)
	}
	if path != n.Namespace {
		return fmt.Errorf("the network namespace of %s is %s, not %s as described", s.instance.Name, path, n.Namespace)
	}
	return nil
}

// releaseUnwantedNetwork releases, right after the instance is described,
// the proxy this process served for a Sandbox whose egress is no longer
// an allowlist, whatever stops the pass later (a mount source missing, a
// name conflict): serveNetwork runs only when the instance is ensured.
func (r *SandboxReconciler) releaseUnwantedNetwork(_ context.Context, s *sandboxScope) (bool, error) {
	if s.instance.Network != nil {
		return false, nil
	}
	if err := r.releaseNetwork(s.instance.Name, s.sb); err != nil {
		return false, fmt.Errorf("releasing the egress proxy of %s, whose egress is no longer an allowlist: %w", s.instance.Name, err)
	}
	return false, nil
}

// releaseNetwork removes the network namespace and proxy of instance
// name when they serve sb: a Sandbox that lost the name to another one
// never tears down that one's way out. What no pass of this process
// served (deleted after a restart) is left to the orphan collector, which
// removes it once no instance has the name.
func (r *SandboxReconciler) releaseNetwork(name string, sb *v1alpha1.Sandbox) error {
	if r.Networks == nil || r.egress == nil || !r.egress.serves(name, sb) {
		return nil
	}
	r.egress.forget(name)
	return r.Networks.Release(name)
}

// serves says whether instance name's proxy serves sb.
func (w *egressWatch) serves(name string, sb *v1alpha1.Sandbox) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	o, ok := w.owners[name]
	return ok && o.sb.UID == sb.UID
}
