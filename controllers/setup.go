// Package controllers converges Sandboxes and SessionClaims: claims bind to
// their Sandbox, the Sandbox counts its live claims and drives its runtime
// (running while claims exist, stopped idleTimeout after the last one goes),
// and both report what they see in status conditions. The controllers never
// write a spec and never delete an agent's host areas.
package controllers

import (
	"context"
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Field indexes the controllers look objects up by.
const (
	indexClaimSandbox = "spec.sandboxName"
	indexSandboxAgent = "spec.agent"
	// indexSandboxWaitingRuntime: the Sandboxes waiting for their
	// runtime, by backend (runtimeWaiting).
	indexSandboxWaitingRuntime = "status.waitingRuntime"
)

// Options configure both controllers.
type Options struct {
	// Runtimes maps each enabled backend to its driver.
	Runtimes map[v1alpha1.Backend]runtimes.Runtime
	// Host gives the areas root and home directory for instance descriptions.
	Host instance.Host
	// NodeName limits the controllers to Sandboxes naming this node; empty
	// means Sandboxes without a node name.
	NodeName string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// HealthInterval is how often a running instance with a writable root
	// is inspected again for OverlayHealthy; zero means 30s.
	HealthInterval time.Duration
	// Endpoint is the exec API's host:port that bound claims publish in
	// status.endpoint; empty publishes none.
	Endpoint string
	// Getenv reads the controller's environment (the insecure disable
	// variable); nil means os.Getenv.
	Getenv func(string) string
	// OrphanInterval is how often instances whose Sandbox is gone are
	// looked for and deleted; zero means 5m.
	OrphanInterval time.Duration
	// GitTimeout bounds each host git call on a claim's repository; zero
	// means worktree.DefaultGitTimeout (30s).
	GitTimeout time.Duration
	// ReconcileTimeout bounds one claim reconcile, so that nothing an
	// agent plants can hold a worker for good; zero means
	// DefaultReconcileTimeout.
	ReconcileTimeout time.Duration
	// SandboxReconcileTimeout bounds one Sandbox reconcile, runtime calls
	// included; zero means DefaultSandboxReconcileTimeout.
	SandboxReconcileTimeout time.Duration
	// SandboxWorkers and ClaimWorkers are how many Sandboxes and claims are
	// reconciled at once (never one object twice at once); zero means 4
	// and 16.
	SandboxWorkers, ClaimWorkers int
	// Networks, when set, makes and serves the network namespaces and
	// proxies of Sandboxes whose egress is an allowlist (Host.NetnsDir is
	// its Dir); nil: such Sandboxes are refused.
	Networks *egress.Networks
	// PodCgroups, when set, finds the cgroup of a Sandbox's Pod
	// (status.pod) on this node, below PodCgroupRoot (the node's cgroup
	// hierarchies as mounted here): the instance's processes run below
	// it, so that the kubelet accounts for them. Nil: they run below the
	// drivers' own cgroup parents, wherever the Sandbox has a Pod.
	PodCgroups    PodCgroupFinder
	PodCgroupRoot string
	// RoutineEvents records a Normal event each time an instance starts
	// or stops idle. Off, the Sandbox's Ready condition (reason Running
	// or Stopped, and its lastTransitionTime) is all that says so: each
	// event is an API write of its own, a fifth of the controller's
	// writes when every Sandbox starts once. Warnings are recorded
	// either way.
	RoutineEvents bool
}

// PodCgroupFinder finds the cgroup an instance of a Pod runs below on this
// node, by the Pod's UID and its container's ID, as a path from the root
// of each hierarchy (cgroup.Pods).
type PodCgroupFinder interface {
	Find(uid, containerID string) (string, error)
}

// DefaultReconcileTimeout is the deadline of one reconcile: longer than a
// host git call (30s) and an in-sandbox git command (2m) together, so
// those fail with their own reasons and the status still gets written.
const DefaultReconcileTimeout = 3 * time.Minute

func reconcileTimeout(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return DefaultReconcileTimeout
}

// DefaultSandboxReconcileTimeout is the deadline of one Sandbox reconcile.
// It is longer than a claim's: a first Ensure may pull an image or create
// an Incus container, which takes minutes on a cold host, and a deadline
// that cut it short every time would never let it finish.
const DefaultSandboxReconcileTimeout = 10 * time.Minute

func sandboxReconcileTimeout(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return DefaultSandboxReconcileTimeout
}

// healthInterval is how often running instances are looked at again
// (overlay health, worktree health, usage).
func (o Options) healthInterval() time.Duration {
	if o.HealthInterval > 0 {
		return o.HealthInterval
	}
	return 30 * time.Second
}

func workers(n, def int) int {
	if n > 0 {
		return n
	}
	return def
}

// Setup registers the field indexes and both controllers with mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	idx := mgr.GetFieldIndexer()
	if err := indexClaims(ctx, idx); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.Sandbox{}, indexSandboxAgent, func(o client.Object) []string {
		return []string{o.(*v1alpha1.Sandbox).Spec.Agent}
	}); err != nil {
		return fmt.Errorf("indexing Sandboxes by agent: %w", err)
	}
	if err := idx.IndexField(ctx, &v1alpha1.Sandbox{}, indexSandboxWaitingRuntime, runtimeWaiting); err != nil {
		return fmt.Errorf("indexing Sandboxes waiting for their runtime: %w", err)
	}
	var ew *egressWatch
	if opts.Networks != nil {
		if err := registerEgressMetrics(); err != nil {
			return fmt.Errorf("registering the egress metrics: %w", err)
		}
		ew = &egressWatch{recorder: bounded(mgr.GetEventRecorderFor("sandbox-egress")), now: opts.Now, owners: map[string]*egressOwner{}} //nolint:staticcheck // core/v1 Events, as the reconcilers'
		opts.Networks.OnDecision = ew.decide
		opts.Host.NetnsDir = opts.Networks.Dir
	}
	gate := &shutdownGate{}
	// A Sandbox's pass tells its claims it is Ready beside its status
	// write, and that write waits for theirs.
	notices := newReadyNotices()
	writes := newClaimWrites()
	notices.writes = writes
	// A claim waits on a Sandbox queued for its first pass here.
	queued := newQueuedSandboxes()
	// With a node name the placer (SetupPlacement, in another process)
	// writes conditions too.
	status := statusWriter{client: mgr.GetClient(), reader: mgr.GetAPIReader(), shared: opts.NodeName != ""}
	sr := &SandboxReconciler{Client: mgr.GetClient(), Options: opts, Recorder: bounded(mgr.GetEventRecorderFor("sandbox-controller")), gate: gate, status: status, egress: ew, notices: notices, queued: queued, writes: writes} //nolint:staticcheck // core/v1 Events, which kubectl describe shows; moving to events.k8s.io is a change of its own
	if err := sr.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Sandbox controller: %w", err)
	}
	gcEvery := opts.OrphanInterval
	if gcEvery == 0 {
		gcEvery = 5 * time.Minute
	}
	if err := mgr.Add(&orphanCollector{reader: mgr.GetAPIReader(), runtimes: opts.Runtimes, networks: opts.Networks, interval: gcEvery, node: opts.NodeName, informers: mgr.GetCache()}); err != nil {
		return fmt.Errorf("adding the orphan collector: %w", err)
	}
	if err := mgr.Add(&shutdownStopper{gate: gate, reader: mgr.GetAPIReader(), runtimes: opts.Runtimes, opts: opts}); err != nil {
		return fmt.Errorf("adding the shutdown stopper: %w", err)
	}
	cr := &SessionClaimReconciler{Client: mgr.GetClient(), Options: opts, Recorder: bounded(mgr.GetEventRecorderFor("sandbox-controller")), status: status, notices: notices, queued: queued, writes: writes} //nolint:staticcheck // as above
	if err := cr.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the SessionClaim controller: %w", err)
	}
	return nil
}

// indexClaims looks claims up by their Sandbox.
func indexClaims(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &v1alpha1.SessionClaim{}, indexClaimSandbox, func(o client.Object) []string {
		return []string{o.(*v1alpha1.SessionClaim).Spec.SandboxName}
	}); err != nil {
		return fmt.Errorf("indexing SessionClaims by sandbox: %w", err)
	}
	return nil
}

// onNode says whether this controller is the one for a Sandbox: the node
// it is pinned or placed on. A controller without a node name runs the
// Sandboxes that are neither.
func onNode(sb *v1alpha1.Sandbox, node string) bool {
	return sb.Node() == node
}
