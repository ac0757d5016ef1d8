package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// Placement. Every node's controller (one started with a node name)
// renews a Lease of its own that says it is alive, how many Sandboxes it
// takes and which backends it enables. The live node whose name sorts
// first is the coordinator: its placer gives each Sandbox that names no
// node one (status.nodeName), spreading them over the eligible nodes, and
// marks the Sandboxes of a lost node NodeLost, moving those whose policy
// allows it. There is no election beyond that: two nodes that briefly
// disagree on who coordinates both write with the object's resourceVersion,
// so the second write fails and is retried against what the first did.

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Lease labels and annotations of a node's controller.
const (
	// LabelNodeLease marks a node controller's Lease.
	LabelNodeLease = "sandbox.cireilclaw.dev/node-lease"
	// AnnotationCapacity is how many Sandboxes the node takes ("0": no limit).
	AnnotationCapacity = "sandbox.cireilclaw.dev/capacity"
	// AnnotationBackends are the backends the node enables, comma-separated.
	AnnotationBackends = "sandbox.cireilclaw.dev/backends"
	// nodeLeasePrefix begins the name of a node's Lease.
	nodeLeasePrefix = "sandbox-node-"
)

// DefaultSystemNamespace is the controller's namespace unless Options says
// otherwise: the node Leases and the exec API's CA live there.
const DefaultSystemNamespace = servingcert.DefaultNamespace

// DefaultNodeLostAfter is how long a node may go without renewing its
// Lease (or stay not Ready) before its Sandboxes are NodeLost.
const DefaultNodeLostAfter = 40 * time.Second

// NodeLeaseName is the name of node's Lease.
func NodeLeaseName(node string) string { return nodeLeasePrefix + node }

func (o Options) systemNamespace() string {
	if o.SystemNamespace != "" {
		return o.SystemNamespace
	}
	return DefaultSystemNamespace
}

func (o Options) nodeLostAfter() time.Duration {
	if o.NodeLostAfter > 0 {
		return o.NodeLostAfter
	}
	return DefaultNodeLostAfter
}

// renewEvery is how often a node renews its Lease and the coordinator
// looks for work: four renewals fit in the time a node may miss them.
func (o Options) renewEvery() time.Duration {
	return max(o.nodeLostAfter()/4, 100*time.Millisecond)
}

// nodeInfo is what the placer knows of one node.
type nodeInfo struct {
	name     string
	capacity int // 0: no limit
	backends []string
	labels   map[string]string
	// lostSince is zero for a live node, else since when it counts as lost.
	lostSince time.Time
	lostWhy   string
	placed    int
	// renewing says this process has seen the node renew its Lease, or is
	// that node, or the Lease's renewTime is recent: only then does it take
	// new Sandboxes. A Lease first read counts as renewed when read (for
	// loss), so a node that died just before this process started would
	// otherwise take them until it counts as lost.
	renewing bool
}

func (n *nodeInfo) live() bool { return n.lostSince.IsZero() }

// nodeView is every node with a Lease, sorted by name, at one moment.
type nodeView struct {
	nodes []*nodeInfo
}

func (v nodeView) get(name string) *nodeInfo {
	for _, n := range v.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// coordinator is the live node whose name sorts first; "" when none is.
func (v nodeView) coordinator() string {
	for _, n := range v.nodes {
		if n.live() {
			return n.name
		}
	}
	return ""
}

// buildView reads the Leases and Nodes as of now. A Lease this process has
// not seen renewed for the lease's duration makes its node lost (clock
// says since when), and so does a Node whose Ready condition has not been
// True for lostAfter.
func buildView(leases []coordinationv1.Lease, nodes []corev1.Node, clock *leaseClock, self string, now time.Time, lostAfter time.Duration) nodeView {
	var v nodeView
	listed := make(map[string]bool, len(leases))
	for i := range leases {
		l := &leases[i]
		name, ok := strings.CutPrefix(l.Name, nodeLeasePrefix)
		if !ok || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name {
			continue
		}
		listed[l.Name] = true
		n := &nodeInfo{name: name}
		n.capacity, _ = strconv.Atoi(l.Annotations[AnnotationCapacity])
		if b := l.Annotations[AnnotationBackends]; b != "" {
			n.backends = strings.Split(b, ",")
		}
		d := lostAfter
		if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		seen, renewing := clock.lastChange(l.Name, l.Spec.RenewTime, now)
		// Seen renewing, this node itself, or a renewTime recent by the
		// node's own clock: a node that stopped before this process
		// started has an old one.
		n.renewing = renewing || name == self || (l.Spec.RenewTime != nil && now.Sub(l.Spec.RenewTime.Time) <= d)
		if now.Sub(seen) > d {
			n.lostSince = seen.Add(d)
			n.lostWhy = fmt.Sprintf("its controller has not renewed its Lease since %s", seen.UTC().Format(time.RFC3339))
			if l.Spec.RenewTime == nil {
				n.lostWhy = "its controller never renewed its Lease"
			}
		}
		v.nodes = append(v.nodes, n)
	}
	clock.forgetAllBut(listed)
	slices.SortFunc(v.nodes, func(a, b *nodeInfo) int { return strings.Compare(a.name, b.name) })
	for i := range nodes {
		n := v.get(nodes[i].Name)
		if n == nil {
			continue
		}
		n.labels = nodes[i].Labels
		if c := nodeReady(&nodes[i]); c != nil && c.Status != corev1.ConditionTrue && now.Sub(c.LastTransitionTime.Time) > lostAfter && n.live() {
			n.lostSince = c.LastTransitionTime.Add(lostAfter)
			n.lostWhy = fmt.Sprintf("its Node has not been Ready since %s (%s)", c.LastTransitionTime.UTC().Format(time.RFC3339), c.Reason)
		}
	}
	return v
}

// addLeaseless adds the nodes that Sandboxes were placed on and that have
// no Lease any more (deleted, or its namespace was), once this process has
// missed the Lease for lostAfter: the placer put them there while the node
// had one, so no controller is left to run them. A node a Sandbox only
// names in spec.nodeName may never have had a controller and is left out.
// Only lost nodes are added: a live one without a Lease would be a
// candidate for new Sandboxes, or the coordinator.
func (v *nodeView) addLeaseless(sandboxes []v1alpha1.Sandbox, clock *leaseClock, now time.Time, lostAfter time.Duration) {
	named := map[string]bool{}
	for i := range sandboxes {
		sb := &sandboxes[i]
		node := sb.Status.NodeName
		if sb.Spec.NodeName != "" || node == "" || v.get(node) != nil {
			continue
		}
		named[node] = true
	}
	for name, since := range clock.missing(named, now) {
		if now.Sub(since) > lostAfter {
			v.nodes = append(v.nodes, &nodeInfo{name: name, lostSince: since.Add(lostAfter),
				lostWhy: fmt.Sprintf("its controller's Lease is gone (missed since %s)", since.UTC().Format(time.RFC3339))})
		}
	}
	slices.SortFunc(v.nodes, func(a, b *nodeInfo) int { return strings.Compare(a.name, b.name) })
}

// leaseClock remembers, for each node's Lease, the renewTime last read and
// when this process first read it. A node is lost when its Lease has not
// changed for the lease's duration by this process's clock: renewTime is
// written by the renewing node's clock, which may be off either way, and
// comparing it with this one would count lost a node that renews on time,
// or miss one that stopped. (The node lifecycle controller keeps its own
// probe times for the same reason.) A Lease first read now counts as
// renewed now, so a coordinator that just started waits a lease duration
// before it counts any node lost.
type leaseClock struct {
	mu   sync.Mutex
	seen map[string]leaseSeen
	// gone is when this process first missed the Lease of a node that
	// Sandboxes were placed on.
	gone map[string]time.Time
}

type leaseSeen struct {
	renew   time.Time
	at      time.Time
	renewed bool
}

// lastChange is when this process first read the Lease name with this
// renewTime (nil: never renewed), and whether it has seen the Lease
// renewed (read it with another renewTime before).
func (c *leaseClock) lastChange(name string, renew *metav1.MicroTime, now time.Time) (time.Time, bool) {
	var r time.Time
	if renew != nil {
		r = renew.Time
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]leaseSeen{}
	}
	s, ok := c.seen[name]
	if !ok || !s.renew.Equal(r) {
		s = leaseSeen{renew: r, at: now, renewed: ok}
		c.seen[name] = s
	}
	return s.at, s.renewed
}

// missing records the nodes in named without a Lease as missed from now
// on unless already missed, forgets the others, and returns since when
// each of named's nodes has been missed.
func (c *leaseClock) missing(named map[string]bool, now time.Time) map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone == nil {
		c.gone = map[string]time.Time{}
	}
	for name := range c.gone {
		if !named[name] {
			delete(c.gone, name)
		}
	}
	out := make(map[string]time.Time, len(named))
	for name := range named {
		if _, ok := c.gone[name]; !ok {
			c.gone[name] = now
		}
		out[name] = c.gone[name]
	}
	return out
}

// forgetAllBut drops the Leases no longer listed.
func (c *leaseClock) forgetAllBut(listed map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.seen {
		if !listed[name] {
			delete(c.seen, name)
		}
	}
}

// count sets how many of sandboxes each node holds; nodeOf says where a
// Sandbox is (nil: Sandbox.Node).
func (v nodeView) count(sandboxes []v1alpha1.Sandbox, nodeOf func(*v1alpha1.Sandbox) string) {
	if nodeOf == nil {
		nodeOf = (*v1alpha1.Sandbox).Node
	}
	for i := range sandboxes {
		if n := v.get(nodeOf(&sandboxes[i])); n != nil && sandboxes[i].DeletionTimestamp.IsZero() {
			n.placed++
		}
	}
}

// readView is the nodes as of now, and whether this node coordinates.
// Only the coordinator goes on to read the Sandboxes, straight from the
// cache without copies (the caller must not change them), and count them.
func readView(ctx context.Context, r client.Reader, opts Options, clock *leaseClock, now time.Time, nodeOf func(*v1alpha1.Sandbox) string) (nodeView, []v1alpha1.Sandbox, bool, error) {
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases, client.InNamespace(opts.systemNamespace()), client.MatchingLabels{LabelNodeLease: "true"}); err != nil {
		return nodeView{}, nil, false, err
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nodeView{}, nil, false, err
	}
	v := buildView(leases.Items, nodes.Items, clock, opts.NodeName, now, opts.nodeLostAfter())
	if v.coordinator() != opts.NodeName {
		return v, nil, false, nil
	}
	var list v1alpha1.SandboxList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nodeView{}, nil, false, err
	}
	v.count(list.Items, nodeOf)
	v.addLeaseless(list.Items, clock, now, opts.nodeLostAfter())
	return v, list.Items, true, nil
}

func nodeReady(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// choose is the eligible node with the fewest Sandboxes (ties: the name
// that sorts first), or "" and why no node is, one reason per node.
func (v nodeView) choose(sb *v1alpha1.Sandbox, except string) (string, string) {
	// A selector no Node label can carry matches nothing: say why.
	if errs := metav1validation.ValidateLabels(sb.Spec.NodeSelector, field.NewPath("spec", "nodeSelector")); len(errs) > 0 {
		return "", errs.ToAggregate().Error()
	}
	var best *nodeInfo
	var why []string
	for _, n := range v.nodes {
		var no string
		switch {
		case n.name == except:
			no = "lost"
		case !n.live():
			no = "lost: " + n.lostWhy
		case !n.renewing:
			no = "not seen renewing its Lease yet"
		case !slices.Contains(n.backends, string(sb.Spec.BackendOrDefault())):
			no = fmt.Sprintf("backend %s not enabled (enables %s)", sb.Spec.BackendOrDefault(), strings.Join(n.backends, ", "))
		case !labels.SelectorFromSet(sb.Spec.NodeSelector).Matches(labels.Set(n.labels)):
			no = "does not match nodeSelector"
		case n.capacity > 0 && n.placed >= n.capacity:
			no = fmt.Sprintf("full (%d of %d)", n.placed, n.capacity)
		}
		if no != "" {
			why = append(why, n.name+": "+no)
			continue
		}
		if best == nil || n.placed < best.placed {
			best = n
		}
	}
	if best != nil {
		return best.name, ""
	}
	if len(why) == 0 {
		return "", "no node controller has a live Lease"
	}
	if len(why) > 8 {
		why = append(why[:8], fmt.Sprintf("and %d more", len(why)-8))
	}
	return "", strings.Join(why, "; ")
}

// nodeHeartbeat renews this node's Lease.
type nodeHeartbeat struct {
	client client.Client
	reader client.Reader
	opts   Options
}

func (h *nodeHeartbeat) NeedLeaderElection() bool { return false }

func (h *nodeHeartbeat) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("lease")
	t := time.NewTicker(h.opts.renewEvery())
	defer t.Stop()
	failing := false
	for {
		err := h.renew(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			logger.Error(err, "renewing this node's Lease; other nodes count it lost after --node-lost-after", "node", h.opts.NodeName)
			failing = true
		case err == nil && failing:
			logger.Info("renewing this node's Lease again", "node", h.opts.NodeName)
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (h *nodeHeartbeat) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.opts.renewEvery()*2)
	defer cancel()
	now := metav1.NewMicroTime(h.opts.Now())
	var backends []string
	for b := range h.opts.Runtimes {
		backends = append(backends, string(b))
	}
	slices.Sort(backends)
	seconds := int32((h.opts.nodeLostAfter() + time.Second - 1) / time.Second)
	key := client.ObjectKey{Namespace: h.opts.systemNamespace(), Name: NodeLeaseName(h.opts.NodeName)}
	var l coordinationv1.Lease
	err := h.reader.Get(ctx, key, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	} else if err != nil {
		return err
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Labels[LabelNodeLease] = "true"
	l.Annotations[AnnotationCapacity] = strconv.Itoa(h.opts.Capacity)
	l.Annotations[AnnotationBackends] = strings.Join(backends, ",")
	holder := h.opts.NodeName
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &holder, &seconds, &now
	if l.ResourceVersion == "" {
		l.Spec.AcquireTime = &now
		return h.client.Create(ctx, &l)
	}
	return h.client.Update(ctx, &l)
}

// placer places Sandboxes and handles lost nodes, on the coordinator.
type placer struct {
	client.Client
	// status is the one writer of statuses, as the reconcilers'.
	status   statusWriter
	opts     Options
	recorder record.EventRecorder
	// clock is when this process saw each node's Lease renewed; the
	// ticker shares it.
	clock *leaseClock
	// recent are placements this process made that the cache may not show
	// yet, so a burst of new Sandboxes is spread, not piled on one node.
	mu     sync.Mutex
	recent map[types.UID]recentPlacement
}

type recentPlacement struct {
	node string
	at   time.Time
}

func (p *placer) setup(mgr ctrl.Manager) error {
	wake := make(chan event.GenericEvent)
	if err := mgr.Add(&placementTicker{reader: mgr.GetClient(), opts: p.opts, clock: p.clock, out: wake}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		// Only a Sandbox without a node needs the placer at once; lost
		// nodes are found by the ticker.
		For(&v1alpha1.Sandbox{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*v1alpha1.Sandbox).Node() == ""
		}))).
		WatchesRawSource(source.Channel(wake, &handler.EnqueueRequestForObject{})).
		Named("placement").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(p)
}

// placementTicker wakes the placer for the Sandboxes that need it: those
// without a node (a node may have room now) and those on a lost node. A
// Lease that stops being renewed sends no event, so this looks.
type placementTicker struct {
	reader client.Reader
	opts   Options
	clock  *leaseClock
	out    chan<- event.GenericEvent
}

func (t *placementTicker) NeedLeaderElection() bool { return false }

func (t *placementTicker) Start(ctx context.Context) error {
	tick := time.NewTicker(t.opts.renewEvery())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		v, sandboxes, coordinating, err := readView(ctx, t.reader, t.opts, t.clock, t.opts.Now(), nil)
		if err != nil || !coordinating {
			continue
		}
		for i := range sandboxes {
			// The cache's own object: the handler reads only its key.
			sb := &sandboxes[i]
			n := sb.Node()
			if n == "" || (v.get(n) != nil && !v.get(n).live()) {
				select {
				case t.out <- event.GenericEvent{Object: sb}:
				case <-ctx.Done():
					return nil
				}
			}
		}
	}
}

func (p *placer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb v1alpha1.Sandbox
	if err := p.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	now := p.opts.Now()
	v, _, coordinating, err := readView(ctx, p.Client, p.opts, p.clock, now, p.nodeOf(now))
	if err != nil || !coordinating {
		return ctrl.Result{}, err
	}
	if sb.Node() == "" && p.nodeOf(now)(&sb) != "" {
		// Placed by this process; the cache has not caught up.
		return ctrl.Result{}, nil
	}
	node := sb.Node()
	switch n := v.get(node); {
	case node == "":
		return p.place(ctx, &sb, v, now, "", "")
	case n != nil && !n.live():
		return p.nodeLost(ctx, &sb, v, n, now)
	}
	return ctrl.Result{}, nil
}

// nodeOf is Sandbox.Node, with this process's placements that the cache
// does not show yet; it forgets those the cache shows or that are old.
func (p *placer) nodeOf(now time.Time) func(*v1alpha1.Sandbox) string {
	return func(sb *v1alpha1.Sandbox) string {
		if n := sb.Node(); n != "" {
			return n
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		r, ok := p.recent[sb.UID]
		if !ok {
			return ""
		}
		if now.Sub(r.at) > recentFor {
			delete(p.recent, sb.UID)
			return ""
		}
		return r.node
	}
}

// remember records a placement the cache may not show yet, and forgets
// those older than recentFor: nodeOf drops an old one only when asked
// about a Sandbox the cache still shows without a node, so without this
// every placement would stay for the life of the process.
func (p *placer) remember(uid types.UID, node string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.recent == nil {
		p.recent = map[types.UID]recentPlacement{}
	}
	for k, r := range p.recent {
		if now.Sub(r.at) > recentFor {
			delete(p.recent, k)
		}
	}
	p.recent[uid] = recentPlacement{node: node, at: now}
}

// recentFor is how long a placement counts before the cache shows it.
const recentFor = time.Minute

// place gives sb a node, or says why none can take it. lost and lostMsg
// are set when sb is moving off a lost node.
func (p *placer) place(ctx context.Context, sb *v1alpha1.Sandbox, v nodeView, now time.Time, lost, lostMsg string) (ctrl.Result, error) {
	node, why := v.choose(sb, lost)
	f := placementFacts{generation: sb.Generation, node: node, lost: lost, lostMsg: lostMsg, why: why}
	switch {
	case node == "" && lost != "":
		f.outcome = stranded
	case node == "":
		f.outcome = unschedulable
	case lost != "":
		f.outcome = movedOff
	default:
		f.outcome = placedOn
	}
	read := sb.DeepCopy()
	if node != "" {
		sb.Status.NodeName, sb.Status.PlacedAt = node, &metav1.Time{Time: now}
	}
	applyConditions(&sb.Status.Conditions, placementConditions(f))
	if !equalStatus(read, sb) {
		// Only over the Sandbox as read: a node's controller or another
		// coordinator that wrote first wins, and this pass is retried.
		if err := p.status.writeStatus(ctx, read, sb, unlessChanged); err != nil {
			return requeueOnConflict(err)
		}
		p.announce(ctx, sb, f, now)
	}
	if node == "" {
		return p.markClaims(ctx, sb)
	}
	return ctrl.Result{}, nil
}

// announce tells of a placement just written: the log, and a Warning
// Event when the Sandbox lost its node or no node can take it.
func (p *placer) announce(ctx context.Context, sb *v1alpha1.Sandbox, f placementFacts, now time.Time) {
	if f.node != "" {
		p.remember(sb.UID, f.node, now)
		log.FromContext(ctx).Info("placed Sandbox", "node", f.node, "from", f.lost)
	}
	ready := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady)
	if ready == nil || f.outcome == placedOn {
		return
	}
	p.recorder.Event(sb, "Warning", ready.Reason, ready.Message)
}

// nodeLost marks sb NodeLost, and moves it when its policy allows.
func (p *placer) nodeLost(ctx context.Context, sb *v1alpha1.Sandbox, v nodeView, n *nodeInfo, now time.Time) (ctrl.Result, error) {
	msg := fmt.Sprintf("node %s lost since %s: %s", n.name, n.lostSince.UTC().Format(time.RFC3339), n.lostWhy)
	if sb.Spec.NodeName == "" && sb.Spec.OnNodeLost == v1alpha1.NodeLostMove {
		return p.place(ctx, sb, v, now, n.name, msg)
	}
	if c := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Reason == v1alpha1.ReasonNodeLost {
		return p.markClaims(ctx, sb)
	}
	read := sb.DeepCopy()
	applyConditions(&sb.Status.Conditions, placementConditions(placementFacts{
		generation: sb.Generation, outcome: staysOn, lost: n.name, lostMsg: msg, pinned: sb.Spec.NodeName != ""}))
	if err := p.status.writeStatus(ctx, read, sb, unlessChanged); err != nil {
		return requeueOnConflict(err)
	}
	p.recorder.Event(sb, "Warning", v1alpha1.ReasonNodeLost, msg)
	return p.markClaims(ctx, sb)
}

// releaseClaim lets a deleted claim of a Sandbox that no live node runs
// go now, when nothing of it is on that node's disk (no worktree), rather
// than when the node is back: it only gave access to the Sandbox, which
// nobody reaches meanwhile, and the node recounts its claims when it is
// back. A claim with a worktree waits for the node, whose controller
// removes or keeps the worktree.
func (p *placer) releaseClaim(ctx context.Context, c *v1alpha1.SessionClaim) error {
	if c.Spec.Worktree != nil || c.Status.Worktree != nil || !controllerutil.ContainsFinalizer(c, v1alpha1.Finalizer) {
		return nil
	}
	controllerutil.RemoveFinalizer(c, v1alpha1.Finalizer)
	// With the resourceVersion read: a node that came back and wrote
	// first wins.
	if err := p.Update(ctx, c); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	log.FromContext(ctx).Info("released a deleted claim while its Sandbox has no live node", "claim", c.Namespace+"/"+c.Name)
	return nil
}

// markClaims tells the claims of a Sandbox that no live node runs (not
// placed, or its node lost) why they are not Ready. No node's controller
// reconciles them meanwhile, and a claim left Ready on a node that is gone
// sends its user there. The node that takes the Sandbox, or comes back,
// derives them again from what it finds. The ticker brings this back for
// claims made later.
func (p *placer) markClaims(ctx context.Context, sb *v1alpha1.Sandbox) (ctrl.Result, error) {
	var list v1alpha1.SessionClaimList
	if err := p.List(ctx, &list, client.InNamespace(sb.Namespace), client.MatchingFields{indexClaimSandbox: sb.Name}); err != nil {
		return ctrl.Result{}, err
	}
	f := claimFacts{binding: bindingNoNode, sandbox: sb.Name, namespace: sb.Namespace, sandboxReady: sandboxReadyCondition(sb)}
	var errs []error
	for i := range list.Items {
		c := &list.Items[i]
		if !c.DeletionTimestamp.IsZero() {
			if err := p.releaseClaim(ctx, c); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		f.generation = c.Generation
		read := c.DeepCopy()
		applyConditions(&c.Status.Conditions, claimConditions(f))
		// Only over the claim as read: a node that came back and wrote
		// first wins.
		if err := p.status.writeStatus(ctx, read, c, unlessChanged); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return requeueOnConflict(err)
	}
	return ctrl.Result{}, nil
}

func equalStatus(a, b *v1alpha1.Sandbox) bool {
	return a.Status.NodeName == b.Status.NodeName &&
		slices.EqualFunc(a.Status.Conditions, b.Status.Conditions, func(x, y metav1.Condition) bool {
			return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message
		})
}
