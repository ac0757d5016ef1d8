package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// SandboxReconciler keeps a Sandbox's runtime instance running while live
// claims exist and stops it idleTimeout after the last one goes.
type SandboxReconciler struct {
	client.Client
	Options
	Recorder record.EventRecorder
	gate     *shutdownGate
	// status is the one writer of the Sandbox's status.
	status statusWriter
	// warned holds, by Sandbox UID, the last generation told it uses a
	// deprecated field, so the warning is one Event a change.
	warned sync.Map
	// egress hears the proxies of Sandboxes with an allowlist; nil
	// without Networks.
	egress *egressWatch
	// notices tell the claims of a Sandbox it started that it is Ready,
	// beside the status write that says so (readyNotices); nil: none.
	notices *readyNotices
	// queued are the Sandboxes waiting for their first pass
	// (queuedSandboxes); nil: none is told.
	queued *queuedSandboxes
	// writes are the claim writes under way, which a Sandbox's status
	// write waits for (claimWrites); nil: it waits for none.
	writes *claimWrites
	// own are this process's recent writes of Sandboxes (ownWrites),
	// whose watch events start no pass.
	own ownWrites
	// owners are the Sandboxes found to own their instance, the only
	// ones whose usage is reported (instanceOwners).
	owners instanceOwners
}

// The controller's own rights, least privilege: it writes a Sandbox only to
// add or drop its finalizer (update), its status only by patch, and never
// creates one. sandboxes/finalizers lets it make a Sandbox a claim's owner.
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sandboxes,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sandboxes/status,verbs=patch
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sandboxes/finalizers,verbs=update
// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sessionclaims,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// SetupWithManager watches Sandboxes and, through the claim index, the
// SessionClaims that count towards them.
//
// Failed reconciles are retried within seconds (retryLimiter), and a
// runtimeProbe re-queues Sandboxes that report RuntimeUnavailable as soon
// as their runtime answers again.
func (r *SandboxReconciler) SetupWithManager(mgr ctrl.Manager) error {
	retries := newRetryLimiter()
	recovered := make(chan event.GenericEvent)
	probe := &runtimeProbe{reader: mgr.GetClient(), runtimes: r.Runtimes, node: r.NodeName, interval: runtimeProbeInterval, out: recovered}
	if err := mgr.Add(probe); err != nil {
		return fmt.Errorf("adding the runtime probe: %w", err)
	}
	usageChanged := make(chan event.GenericEvent)
	usage := &usageWatcher{informers: mgr.GetCache(), runtimes: r.Runtimes, node: r.NodeName, interval: r.healthInterval(),
		recorder: r.Recorder, seen: map[string]runtimes.Usage{}, out: usageChanged, owners: &r.owners}
	if err := mgr.Add(usage); err != nil {
		return fmt.Errorf("adding the usage watcher: %w", err)
	}
	// One WithPredicates: a second one replaces the first.
	forPredicates := []predicate.Predicate{r.own.echoes()}
	if r.queued != nil {
		forPredicates = append(forPredicates, r.queued.created())
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Sandbox{}, builder.WithPredicates(forPredicates...)).
		Watches(&v1alpha1.SessionClaim{}, &claimsOfSandbox{reader: mgr.GetClient()}, builder.WithPredicates(claimChangesForSandbox)).
		// A Sandbox that loses the agent name to another one must hear when
		// that one goes.
		Watches(&v1alpha1.Sandbox{}, handler.EnqueueRequestsFromMapFunc(r.sameAgent)).
		Watches(&v1alpha1.SandboxClass{}, handler.EnqueueRequestsFromMapFunc(r.classSandboxes)).
		WatchesRawSource(source.Channel(recovered, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Channel(usageChanged, &handler.EnqueueRequestForObject{})).
		Named("sandbox").
		WithOptions(controller.Options{
			MaxConcurrentReconciles: workers(r.SandboxWorkers, 4),
			ReconciliationTimeout:   sandboxReconcileTimeout(r.SandboxReconcileTimeout),
			RateLimiter:             retries,
		}).
		Complete(withRetries(retries, r))
}

func (r *SandboxReconciler) sameAgent(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.SandboxList
	if err := r.List(ctx, &list, client.MatchingFields{indexSandboxAgent: o.(*v1alpha1.Sandbox).Spec.Agent}); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, sb := range list.Items {
		if sb.UID != o.GetUID() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sb)})
		}
	}
	return reqs
}

// sandboxScope is what one reconcile of one Sandbox works on.
type sandboxScope struct {
	sb       *v1alpha1.Sandbox
	owner    string
	rt       runtimes.Runtime
	instance runtimes.Instance
	claims   []v1alpha1.SessionClaim
	live     int
	state    runtimes.State
	// gitDirs are the worktrees' git directories the instance must mount.
	gitDirs []string
	// facts are what the phases found; the status is derived from them
	// once, at the end (sandboxConditions).
	facts sandboxFacts
	// retry, when set, is when a phase that stopped the pass wants it
	// again.
	retry time.Duration
}

// Reconcile converges one Sandbox. It is safe to repeat after a crash at
// any line: every step looks at what exists before it acts.
func (r *SandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	if r.gate != nil {
		if !r.gate.enter() {
			return ctrl.Result{}, nil
		}
		defer r.gate.leave()
	}
	defer r.queued.passed(req.NamespacedName)
	r.writes.enter()
	defer r.writes.leave()
	sb := &v1alpha1.Sandbox{}
	if err := r.Get(ctx, req.NamespacedName, sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !onNode(sb, r.NodeName) {
		return ctrl.Result{}, nil
	}
	cached := sb.ResourceVersion
	r.reportUndecodable(ctx, sb)
	if !controllerutil.ContainsFinalizer(sb, v1alpha1.Finalizer) && sb.DeletionTimestamp.IsZero() {
		// The pass goes on with the object as the patch stored it: a new
		// Sandbox with a claim starts in this pass, not in one more trip
		// through the queue behind every other new Sandbox.
		before := sb.DeepCopy()
		if err := patchFinalizer(ctx, r.Client, sb, true); err != nil {
			return requeueOnConflict(err)
		}
		r.own.wrote(before, sb)
	}

	read := sb.DeepCopy()
	s := &sandboxScope{sb: sb, owner: instance.Owner(req.Namespace, req.Name)}
	sb.Status.Instance = v1alpha1.InstanceName(sb.Spec.Agent)
	if r.NodeName != "" {
		// Pinned or placed here; -o wide shows it either way.
		sb.Status.NodeName = r.NodeName
	}
	defer func() {
		s.facts.generation, s.facts.instance, s.facts.live = sb.Generation, sb.Status.Instance, s.live
		applyConditions(&sb.Status.Conditions, sandboxConditions(s.facts))
		if retErr == nil {
			sb.Status.ObservedGeneration = sb.Generation
		}
		r.notices.announce([2]string{cached, read.ResourceVersion}, read, sb, s.claims)
		// The claims' writes first: theirs is the Ready a user waits for.
		r.writes.wait(ctx, req.NamespacedName)
		if err := r.status.writeStatus(ctx, read, sb, mergeConditions); err != nil {
			r.notices.withdraw(sb)
			retErr = errors.Join(retErr, err)
			return
		}
		r.own.wrote(read, sb)
	}()

	if err := r.loadClaims(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	sb.Status.Claims = int32(s.live)

	if !sb.DeletionTimestamp.IsZero() {
		r.owners.drop(sb.Spec.Agent, sb.UID)
		return r.reconcileDelete(ctx, s)
	}
	for _, phase := range []func(context.Context, *sandboxScope) (bool, error){
		r.checkBackend, r.checkEnforcement, r.describe, r.releaseUnwantedNetwork, r.checkNameConflict, r.inspect,
	} {
		if stop, err := phase(ctx, s); stop || err != nil {
			r.owners.drop(sb.Spec.Agent, sb.UID)
			return ctrl.Result{RequeueAfter: s.retry}, err
		}
	}
	r.owners.set(sb.Spec.Agent, sb.UID)
	return r.converge(ctx, s)
}

func (r *SandboxReconciler) loadClaims(ctx context.Context, s *sandboxScope) error {
	var list v1alpha1.SessionClaimList
	if err := r.List(ctx, &list, client.InNamespace(s.sb.Namespace), client.MatchingFields{indexClaimSandbox: s.sb.Name}); err != nil {
		return fmt.Errorf("listing claims of Sandbox %s: %w", s.owner, err)
	}
	s.claims = list.Items
	for _, c := range list.Items {
		if c.DeletionTimestamp.IsZero() {
			s.live++
		}
	}
	return nil
}

func (r *SandboxReconciler) checkBackend(_ context.Context, s *sandboxScope) (bool, error) {
	backend := s.sb.Spec.BackendOrDefault()
	rt, ok := r.Runtimes[backend]
	if !ok {
		s.facts.fail(v1alpha1.ReasonBackendUnavailable, fmt.Sprintf("this controller was not started with the %s backend (enabled: %v)", backend, r.enabledBackends()))
		return true, nil
	}
	s.rt = rt
	return false, nil
}

// checkEnforcement makes an unsandboxed bwrap backend impossible to miss:
// with the insecure disable variable set, every bwrap Sandbox says so in a
// condition and a Warning Event.
func (r *SandboxReconciler) checkEnforcement(_ context.Context, s *sandboxScope) (bool, error) {
	if s.sb.Spec.BackendOrDefault() != v1alpha1.BackendBwrap {
		s.facts.enforcement = enforcementNone
		return false, nil
	}
	value, disabled := policy.SandboxDisabled(r.Getenv)
	s.facts.enforcementValue = value
	if !disabled {
		s.facts.enforcement = enforcementOn
		return false, nil
	}
	s.facts.enforcement = enforcementOff
	if !meta.IsStatusConditionFalse(s.sb.Status.Conditions, v1alpha1.ConditionSandboxEnforced) {
		r.Recorder.Event(s.sb, "Warning", v1alpha1.ReasonSandboxDisabled, enforcementOffMessage(value))
	}
	return false, nil
}

func (r *SandboxReconciler) enabledBackends() []string {
	var out []string
	for b := range r.Runtimes {
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}

func (r *SandboxReconciler) inspect(ctx context.Context, s *sandboxScope) (bool, error) {
	st, err := s.rt.Inspect(ctx, s.instance.Name)
	if err != nil {
		s.facts.failErr(err)
		return true, err
	}
	if st.Exists && st.Owner != s.owner {
		s.facts.fail(v1alpha1.ReasonNameConflict, fmt.Sprintf("instance %s exists and belongs to %s", st.Name, st.Owner))
		return true, nil
	}
	s.state = st
	return false, nil
}

// converge starts the instance while claims exist and stops it once it has
// been idle for idleTimeout, unless keepRunning says otherwise.
func (r *SandboxReconciler) converge(ctx context.Context, s *sandboxScope) (ctrl.Result, error) {
	sb := s.sb
	now := r.Now()
	var res ctrl.Result
	if s.state.Overlay != nil || (s.state.Running && hasCustomMounts(s.instance)) {
		// Overlay health and mount sources change without any event we
		// could watch.
		res.RequeueAfter = r.healthInterval()
	}
	// A command binds every mount source, so an instance whose source is
	// gone is not Ready whatever the runtime says. Only checked while the
	// instance is wanted or running: a stopped Sandbox without claims
	// needs nothing from its sources yet.
	var mountErr error
	if s.live > 0 || s.state.Running {
		mountErr = runtimes.CheckMountSources(s.instance)
	}
	defer func() {
		s.facts.converged, s.facts.overlay, s.facts.claims = true, s.state.Overlay, s.claims
		s.facts.usage = r.readUsage(s)
		sb.Status.Usage = usageStatus(s.facts.usage)
		sb.Status.MountedGitDirs = nil
		if s.state.Running && s.state.ConfigHash == s.instance.ConfigHash {
			sb.Status.MountedGitDirs = s.gitDirs
		}
	}()

	switch {
	case s.live > 0:
		sb.Status.IdleSince = nil
		if mountErr != nil {
			return r.mountSourceMissing(ctx, s, mountErr, res), nil
		}
		if err := r.ensure(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		if s.state.RestartRequired != "" && sb.Spec.RestartPolicy != v1alpha1.RestartImmediate {
			s.facts.run, s.facts.restartPending = runForClaims, s.state.RestartRequired
			return res, nil
		}
		if err := r.restartIfRequired(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		s.facts.run = runForClaims
		return res, nil

	case !s.state.Running:
		sb.Status.IdleSince = nil
		s.facts.run = runStopped
		return res, nil

	case sb.Spec.KeepRunning:
		sb.Status.IdleSince = nil
		if mountErr != nil {
			return r.mountSourceMissing(ctx, s, mountErr, res), nil
		}
		if err := r.ensure(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.restartIfRequired(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		s.facts.run = runKeepRunning
		return res, nil
	}

	// Idle: the stop still comes on time when a mount source is gone;
	// only applying a changed spec waits for the source.
	if mountErr == nil {
		if err := r.ensure(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	if s.state.RestartRequired != "" {
		// Nothing holds the instance, so a change it cannot take live is
		// applied now by stopping it; the next claim starts it anew.
		return res, r.stopIdle(ctx, s, "a spec change ("+s.state.RestartRequired+") while no claim held it")
	}
	if sb.Status.IdleSince == nil {
		// The API server stores whole seconds; rounding up keeps the stop
		// from ever coming before idleTimeout has passed.
		t := now.Truncate(time.Second)
		if t.Before(now) {
			t = t.Add(time.Second)
		}
		since := metav1.NewTime(t)
		sb.Status.IdleSince = &since
	}
	stopAt := sb.Status.IdleSince.Add(idleTimeout(sb))
	if now.Before(stopAt) {
		if mountErr != nil {
			res = r.mountSourceMissing(ctx, s, mountErr, res)
		} else {
			s.facts.run, s.facts.stopAt = runIdle, stopAt
		}
		if wait := stopAt.Sub(now); res.RequeueAfter == 0 || wait < res.RequeueAfter {
			res.RequeueAfter = wait
		}
		return res, nil
	}
	return res, r.stopIdle(ctx, s, fmt.Sprintf("%s without claims", idleTimeout(sb)))
}

// mountSourceMissing reports a mount source that keeps commands from
// running and checks again soon: nothing announces that a host directory
// came back, and Ready must return without anyone touching the Sandbox.
func (r *SandboxReconciler) mountSourceMissing(ctx context.Context, s *sandboxScope, err error, res ctrl.Result) ctrl.Result {
	msg := err.Error()
	if c := findCondition(s.sb.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonMountSourceMissing {
		r.Recorder.Event(s.sb, "Warning", v1alpha1.ReasonMountSourceMissing, msg)
		log.FromContext(ctx).Info("mount source missing; the Sandbox is not Ready until it is back", "problem", msg)
	}
	s.facts.fail(v1alpha1.ReasonMountSourceMissing, msg)
	if retry := r.mountSourceRetry(); res.RequeueAfter == 0 || retry < res.RequeueAfter {
		res.RequeueAfter = retry
	}
	return res
}

// mountSourceRetry is how often a missing mount source is looked for
// again: the health interval, and at most every 10s.
func (r *SandboxReconciler) mountSourceRetry() time.Duration {
	return min(r.healthInterval(), 10*time.Second)
}

func hasCustomMounts(in runtimes.Instance) bool {
	for _, b := range in.Mounts {
		if !b.GitDir {
			return true
		}
	}
	return false
}

func (r *SandboxReconciler) stopIdle(ctx context.Context, s *sandboxScope, why string) error {
	if err := s.rt.Stop(ctx, s.instance.Name); err != nil {
		s.facts.failErr(err)
		return err
	}
	s.state.Running = false
	log.FromContext(ctx).Info("stopped idle instance", "instance", s.instance.Name, "why", why)
	r.routineEvent(s.sb, v1alpha1.ReasonStopped, "stopped instance %s after %s", s.instance.Name, why)
	s.sb.Status.IdleSince = nil
	s.facts.run = runStoppedIdle
	return nil
}

// restartIfRequired stops and starts the instance when Ensure could not
// apply the spec live.
func (r *SandboxReconciler) restartIfRequired(ctx context.Context, s *sandboxScope) error {
	if s.state.RestartRequired == "" {
		return nil
	}
	what := s.state.RestartRequired
	if err := s.rt.Stop(ctx, s.instance.Name); err != nil {
		s.facts.failErr(err)
		return err
	}
	s.state.Running = false
	if err := r.ensure(ctx, s); err != nil {
		return err
	}
	r.Recorder.Eventf(s.sb, "Normal", v1alpha1.ReasonRestartRequired, "restarted instance %s to apply %s", s.instance.Name, what)
	return nil
}

// routineEvent records a Normal event of an instance's start or stop, when
// Options.RoutineEvents asks for them.
func (r *SandboxReconciler) routineEvent(sb *v1alpha1.Sandbox, reason, format string, args ...any) {
	if r.RoutineEvents {
		r.Recorder.Eventf(sb, "Normal", reason, format, args...)
	}
}

// ensure starts the instance unless it already runs with this configuration,
// so a restarted controller adopts a running instance instead of recreating it.
func (r *SandboxReconciler) ensure(ctx context.Context, s *sandboxScope) error {
	if err := r.network(ctx, s, false); err != nil {
		return err
	}
	if s.state.Running && s.state.ConfigHash == s.instance.ConfigHash {
		return r.network(ctx, s, true)
	}
	st, err := s.rt.Ensure(ctx, s.instance)
	if err != nil {
		s.facts.failErr(err)
		r.Recorder.Eventf(s.sb, "Warning", instance.ErrorReason(err), "ensuring instance %s: %v", s.instance.Name, err)
		return err
	}
	if !s.state.Running {
		log.FromContext(ctx).Info("started instance", "instance", s.instance.Name, "claims", s.live)
		r.routineEvent(s.sb, v1alpha1.ReasonRunning, "started instance %s for %d claim(s)", s.instance.Name, s.live)
	}
	s.state = st
	return r.network(ctx, s, true)
}

// network serves the instance's egress proxy (serveNetwork) and reports
// a failure as the pass's.
func (r *SandboxReconciler) network(ctx context.Context, s *sandboxScope, started bool) error {
	if err := r.serveNetwork(ctx, s, started); err != nil {
		s.facts.failErr(err)
		r.Recorder.Eventf(s.sb, "Warning", instance.ErrorReason(err), "%v", err)
		return err
	}
	return nil
}

// claimsGrace is how long a deleted Sandbox leaves its claims to be
// deleted by whoever deletes it before it deletes them itself.
const claimsGrace = 2 * time.Second

// reconcileDelete releases the claims first (their own finalizers clean up
// after them), then deletes the instance, and never the host areas.
func (r *SandboxReconciler) reconcileDelete(ctx context.Context, s *sandboxScope) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(s.sb, v1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	live := 0
	for i := range s.claims {
		if s.claims[i].DeletionTimestamp.IsZero() {
			live++
		}
	}
	// The claims' own deleters go first: kubectl delete -f of a file
	// holding the Sandbox and its claims deletes the claims a moment after
	// the Sandbox, and a claim without a worktree has no finalizer to hold
	// it meanwhile, so kubectl would find it gone and fail. What is left
	// after claimsGrace the controller deletes.
	if wait := time.Until(s.sb.DeletionTimestamp.Add(claimsGrace)); live > 0 && wait > 0 {
		s.facts.fail(v1alpha1.ReasonDeleting, fmt.Sprintf("deleting: the %d claim(s) not deleted with the Sandbox are deleted %s after it", live, claimsGrace))
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	for i := range s.claims {
		c := &s.claims[i]
		if c.DeletionTimestamp.IsZero() {
			if err := r.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, fmt.Errorf("deleting claim %s/%s of a deleted Sandbox: %w", c.Namespace, c.Name, err)
			}
		}
	}
	if len(s.claims) > 0 {
		s.facts.fail(v1alpha1.ReasonDeleting, fmt.Sprintf("waiting for %d claim(s) to be released", len(s.claims)))
		return ctrl.Result{}, nil
	}
	if rt, ok := r.Runtimes[s.sb.Spec.BackendOrDefault()]; ok {
		name := v1alpha1.InstanceName(s.sb.Spec.Agent)
		st, err := rt.Inspect(ctx, name)
		if err != nil {
			s.facts.failErr(err)
			return ctrl.Result{}, err
		}
		// A Sandbox that lost the name to another one never deletes that one's instance.
		if st.Exists && st.Owner == s.owner {
			if err := rt.Delete(ctx, name); err != nil {
				s.facts.failErr(err)
				return ctrl.Result{}, err
			}
			log.FromContext(ctx).Info("deleted instance; host areas kept", "instance", name)
		}
		if err := r.releaseNetwork(name, s.sb); err != nil {
			s.facts.failErr(err)
			return ctrl.Result{}, err
		}
	}
	if err := patchFinalizer(ctx, r.Client, s.sb, false); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}

// patchFinalizer adds or removes the controller's finalizer with a patch
// of the finalizers alone (guarded by the resourceVersion read). An update
// would send the whole spec back as Go encodes it (idleTimeout "5m" as
// "5m0s"), which moves metadata.generation and puts a spec the user did
// not change before the class's admission policy again.
func patchFinalizer(ctx context.Context, c client.Client, obj client.Object, add bool) error {
	before := obj.DeepCopyObject().(client.Object)
	if add {
		controllerutil.AddFinalizer(obj, v1alpha1.Finalizer)
	} else {
		controllerutil.RemoveFinalizer(obj, v1alpha1.Finalizer)
	}
	return c.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

func idleTimeout(sb *v1alpha1.Sandbox) time.Duration {
	if sb.Spec.IdleTimeout == nil {
		return 5 * time.Minute
	}
	return sb.Spec.IdleTimeout.Duration
}
