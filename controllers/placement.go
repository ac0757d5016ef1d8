package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
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

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// Placement on a cluster: a Pod per Sandbox. The placer (run by the
// aggregated API's Deployment, --mode=api) gives every Sandbox a Pod in
// the Sandbox's namespace, owned by it, carrying its resources as requests
// and limits and its scheduling fields; kube-scheduler binds the Pod to a
// node, and that node runs the Sandbox: the placer copies the Pod's node
// to status.nodeName, where the node's controller finds it. While the Pod
// waits for a node, or the API server refuses it (a ResourceQuota, a
// LimitRange, Pod Security admission), the Sandbox's Ready condition says
// so in the scheduler's or the API server's own words. A node's loss is
// the Pod's: the Pod of an onNodeLost: Stay Sandbox tolerates it for ever;
// that of a Move Sandbox is evicted after NodeLostAfter and replaced by one
// the scheduler binds elsewhere.
//
// The Pod runs the pause image and nothing else: it reserves the node's
// room and carries the Sandbox through quota and admission; the
// Sandbox's processes are the node's controller's.

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Labels of the Pods the placer makes, and of the node controllers' Pods.
const (
	// LabelSandboxPod marks a Sandbox's Pod ("true").
	LabelSandboxPod = "sandbox.cireilclaw.dev/sandbox-pod"
	// LabelSandboxUID is the UID of the Pod's Sandbox.
	LabelSandboxUID = "sandbox.cireilclaw.dev/sandbox-uid"
	// LabelBackendPrefix, followed by a backend's name, marks a node
	// controller's Pod that enables that backend ("true"): a Sandbox's Pod
	// is scheduled only beside one, on the same node.
	LabelBackendPrefix = "backends.sandbox.cireilclaw.dev/"
)

// DefaultSystemNamespace is the controller's namespace unless Options says
// otherwise: the node controllers' Pods and the exec API's CA live there.
const DefaultSystemNamespace = servingcert.DefaultNamespace

// DefaultNodeLostAfter is how long the Pod of an onNodeLost: Move Sandbox
// tolerates its node being not ready or unreachable before it is evicted
// and the Sandbox moves.
const DefaultNodeLostAfter = 40 * time.Second

// DefaultPodImage is the image of the Sandboxes' Pods: the pause image
// every node of a cluster holds for its pods' sandboxes.
const DefaultPodImage = "registry.k8s.io/pause:3.10"

// PlacementOptions configure the placer.
type PlacementOptions struct {
	// SystemNamespace is where the node controllers' Pods run; empty:
	// DefaultSystemNamespace.
	SystemNamespace string
	// PodImage is the image of the Sandboxes' Pods; empty: DefaultPodImage.
	PodImage string
	// HolderImage is the image the Pod of a bwrap Sandbox with an image
	// (spec.bwrap.image) copies the holder from (the controller's own,
	// which holds cmd/sandbox-holder at HolderPath): its init container
	// copies it into an emptyDir, and the image's container runs it, so
	// that the node's runtime mounts the image's file system for the
	// node's controller. Empty: such Sandboxes are not placed (PodRefused).
	HolderImage string
	// NodeLostAfter is how long a Move Sandbox's Pod tolerates the loss of
	// its node; zero: DefaultNodeLostAfter.
	NodeLostAfter time.Duration
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

func (o *PlacementOptions) defaults() {
	if o.SystemNamespace == "" {
		o.SystemNamespace = DefaultSystemNamespace
	}
	if o.PodImage == "" {
		o.PodImage = DefaultPodImage
	}
	if o.NodeLostAfter <= 0 {
		o.NodeLostAfter = DefaultNodeLostAfter
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// indexSandboxNode finds the Sandboxes a node runs.
const indexSandboxNode = "status.node"

// SetupPlacement registers the placer with mgr, whose cache must hold the
// Sandboxes' Pods (LabelSandboxPod), Nodes, Sandboxes and claims.
func SetupPlacement(ctx context.Context, mgr ctrl.Manager, o PlacementOptions) error {
	o.defaults()
	idx := mgr.GetFieldIndexer()
	if err := indexClaims(ctx, idx); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.Sandbox{}, indexSandboxNode, func(obj client.Object) []string {
		if n := obj.(*v1alpha1.Sandbox).Node(); n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing Sandboxes by node: %w", err)
	}
	p := &placer{
		Client:   mgr.GetClient(),
		status:   statusWriter{client: mgr.GetClient(), reader: mgr.GetAPIReader(), shared: true},
		opts:     o,
		recorder: bounded(mgr.GetEventRecorderFor("sandbox-placement")), //nolint:staticcheck // core/v1 Events, as the reconcilers'
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Sandbox{}, builder.WithPredicates(predicate.Funcs{
			// A node's controller writes the status often; the placer
			// cares for the spec, the node and the conditions' reason.
			UpdateFunc: func(e event.UpdateEvent) bool {
				a, b := e.ObjectOld.(*v1alpha1.Sandbox), e.ObjectNew.(*v1alpha1.Sandbox)
				return a.Generation != b.Generation || a.Status.NodeName != b.Status.NodeName ||
					!equality.Semantic.DeepEqual(a.Status.Pod, b.Status.Pod) ||
					readyReason(a) != readyReason(b) || !b.DeletionTimestamp.IsZero()
			},
		})).
		Owns(&corev1.Pod{}).
		// A claim made or deleted while its Sandbox has no node: no
		// node's controller looks at it.
		Watches(&v1alpha1.SessionClaim{}, handler.EnqueueRequestsFromMapFunc(claimSandbox), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
			},
		})).
		// A class that comes to allow what it refused, or to refuse what
		// it allowed.
		Watches(&v1alpha1.SandboxClass{}, handler.EnqueueRequestsFromMapFunc(p.classChanged), builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return true },
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() || !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
			},
			DeleteFunc:  func(event.DeleteEvent) bool { return true },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(p.sandboxesOn), builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false },
			UpdateFunc: func(e event.UpdateEvent) bool {
				return nodeReadyStatus(e.ObjectOld.(*corev1.Node)) != nodeReadyStatus(e.ObjectNew.(*corev1.Node))
			},
			DeleteFunc:  func(event.DeleteEvent) bool { return true },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Named("placement").
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(p)
}

func readyReason(sb *v1alpha1.Sandbox) string {
	if c := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// sandboxesOn is every Sandbox the node runs.
func (p *placer) sandboxesOn(ctx context.Context, n client.Object) []reconcile.Request {
	var list v1alpha1.SandboxList
	if err := p.List(ctx, &list, client.MatchingFields{indexSandboxNode: n.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the Sandboxes of a node", "node", n.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// classChanged is every Sandbox a class change may allow a Pod: those on
// no node (a class kept them from one), and those a class forbids (their
// Pod was removed). A class that narrows reaches the others through their
// nodes' controllers, whose ClassForbids is a change of the Sandbox's,
// except those whose spec it still allows while their Pod carries what
// it no longer does (made before the spec let go of it): those are here
// too.
func (p *placer) classChanged(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.SandboxList
	if err := p.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing the Sandboxes a class change concerns")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		sb := &list.Items[i]
		if sb.Node() == "" || readyReason(sb) == v1alpha1.ReasonClassForbids {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(sb)})
		}
	}
	var pods corev1.PodList
	if err := p.List(ctx, &pods, client.MatchingLabels{LabelSandboxPod: "true"}); err != nil {
		log.FromContext(ctx).Error(err, "listing the Pods a class change concerns")
		return out
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		owner := sandboxController(pod)
		if owner == nil || !pod.DeletionTimestamp.IsZero() {
			continue
		}
		if c := p.podCarries(pod); c.PriorityClassName != "" || len(c.Tolerations) > 0 ||
			c.Affinity != nil && (c.Affinity.PodAffinity != nil || c.Affinity.PodAntiAffinity != nil) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: pod.Namespace, Name: owner.Name}})
		}
	}
	return out
}

func claimSandbox(_ context.Context, o client.Object) []reconcile.Request {
	c := o.(*v1alpha1.SessionClaim)
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: c.Namespace, Name: c.Spec.SandboxName}}}
}

// placer gives Sandboxes their Pods and follows them.
type placer struct {
	client.Client
	// status is the one writer of statuses, as the reconcilers'.
	status   statusWriter
	opts     PlacementOptions
	recorder record.EventRecorder
}

func (p *placer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb v1alpha1.Sandbox
	if err := p.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		// The Pods go with it (they are its own). A Sandbox that no node
		// ever took may carry the finalizer the admission policy gives a
		// new one (config/admission/finalizer_policy.yaml); no node's
		// controller will remove it, so this does. The patch holds only
		// against the version read: a node named meanwhile fails it.
		if sb.Node() == "" && controllerutil.ContainsFinalizer(&sb, v1alpha1.Finalizer) {
			if err := patchFinalizer(ctx, p.Client, &sb, false); err != nil {
				return requeueOnConflict(client.IgnoreNotFound(err))
			}
		}
		return ctrl.Result{}, nil
	}
	var pods corev1.PodList
	if err := p.List(ctx, &pods, client.InNamespace(sb.Namespace), client.MatchingLabels{LabelSandboxUID: string(sb.UID)}); err != nil {
		return ctrl.Result{}, err
	}
	found := sandboxPods(&sb, pods.Items)
	cur := found.cur
	// Pods that ended (evicted by the kubelet, refused at its admission)
	// are replaced, and live ones that no longer stand for the Sandbox (a
	// second one made from a cache that was behind, one bound elsewhere
	// than spec.nodeName now pins) are removed: one Pod per Sandbox holds
	// room.
	if cur == nil && len(found.ended) > 0 {
		// A Pod the kubelet refused or ended is replaced after a while,
		// longer each time, so a node that keeps refusing it is not asked
		// in a loop. The wait is counted from when the Pod ended, kept in
		// sight until then: deleting it first would bring this back at
		// once, through the deletion's event.
		if wait := replaceWait(found.ended, found.next, p.opts.Now()); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	extra := found.ended
	if cur != nil && sb.Spec.NodeName != "" && cur.Spec.NodeName != "" && cur.Spec.NodeName != sb.Spec.NodeName {
		extra, cur = append(extra, cur), nil
	}
	extra = append(extra, found.stale...)
	for _, d := range extra {
		if err := p.Delete(ctx, d, client.Preconditions{UID: &d.UID}); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
	}
	if cur == nil {
		return p.createPod(ctx, &sb, found)
	}
	// A class narrowed since the Pod was made: what the Pod carries past
	// its placement (a priority, tolerations, affinity to other Pods, a
	// pinned node) goes with it. Only a class found and refusing those:
	// a class that cannot be picked for a while (two marked default
	// during a change) leaves the Pod, and the node's controller stops
	// the Sandbox meanwhile.
	if why, err := p.schedulingForbidden(ctx, &sb, cur); err != nil {
		return ctrl.Result{}, err
	} else if why != "" {
		log.FromContext(ctx).Info("removing the Sandbox's Pod: its class no longer allows what it carries", "pod", cur.Name, "why", why)
		if err := p.Delete(ctx, cur, client.Preconditions{UID: &cur.UID}); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return p.notPlaced(ctx, &sb, v1alpha1.ReasonClassForbids, why)
	}
	switch image, replace := p.podDrift(&sb, cur); {
	case replace:
		// Made again at once, on the node it was bound to unless the
		// Sandbox moves (createPod).
		log.FromContext(ctx).Info("replacing the Sandbox's Pod: its image settings changed", "pod", cur.Name)
		if err := p.Delete(ctx, cur, client.Preconditions{UID: &cur.UID}); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case image != "":
		patch := client.StrategicMergeFrom(cur.DeepCopy())
		for i := range cur.Spec.Containers {
			if cur.Spec.Containers[i].Name == podContainer {
				cur.Spec.Containers[i].Image = image
			}
		}
		log.FromContext(ctx).Info("setting the Sandbox's Pod's image", "pod", cur.Name, "image", image)
		if err := p.Patch(ctx, cur, patch); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	node := cur.Spec.NodeName
	if node == "" {
		return p.pending(ctx, &sb, cur)
	}
	var n corev1.Node
	lost := ""
	switch err := p.Get(ctx, client.ObjectKey{Name: node}, &n); {
	case apierrors.IsNotFound(err):
		lost = fmt.Sprintf("node %s is gone (its Node was deleted)", node)
	case err != nil:
		return ctrl.Result{}, err
	default:
		if c := nodeReady(&n); c == nil || c.Status != corev1.ConditionTrue {
			lost = nodeLostMessage(&n, c)
		}
	}
	if sb.Status.NodeName != node {
		return p.placed(ctx, &sb, cur)
	}
	p.reportWaiting(&sb, cur)
	if !isSandboxPod(sb.Status.Pod, &sb, cur) {
		return p.recordPod(ctx, &sb, cur)
	}
	if lost != "" {
		return p.nodeLost(ctx, &sb, cur, &n, lost)
	}
	return ctrl.Result{}, nil
}

// recordPod records sb's Pod where its node stays the same: its container
// started (or started again), or a Pod that ended was replaced on the
// node that pins the Sandbox. The node's controller moves the instance
// into the container's cgroup.
func (p *placer) recordPod(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod) (ctrl.Result, error) {
	read := sb.DeepCopy()
	sb.Status.Pod = podRef(sb, pod)
	if err := p.status.writeStatus(ctx, read, sb, unlessChanged); err != nil {
		return requeueOnConflict(err)
	}
	return ctrl.Result{}, nil
}

// reportWaiting says on the Sandbox why the kubelet does not run its
// Pod's container (an image it cannot pull, say): the node's controller,
// which cannot read Pods, only says that it waits for it (PodStarting).
// Repeats are counted on one Event by the recorder.
func (p *placer) reportWaiting(sb *v1alpha1.Sandbox, pod *corev1.Pod) {
	for _, c := range pod.Status.ContainerStatuses {
		if w := c.State.Waiting; c.Name == podContainer && w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			p.recorder.Event(sb, "Warning", EventPodNotRunning, boundedMessage(fmt.Sprintf("the container of Pod %s waits: %s: %s", pod.Name, w.Reason, w.Message)))
		}
	}
}

// EventPodNotRunning is the reason of the Event that says why the kubelet
// does not run a Sandbox's Pod's container.
const EventPodNotRunning = "PodNotRunning"

// isSandboxPod says whether ref names sb's Pod pod as it is now.
func isSandboxPod(ref *v1alpha1.SandboxPod, sb *v1alpha1.Sandbox, pod *corev1.Pod) bool {
	return ref != nil && *ref == *podRef(sb, pod)
}

// podRef names sb's Pod pod, and its container once the kubelet runs it.
// For a bwrap Sandbox with an image, whose commands the node runs over
// that container's file system, only a container of the Sandbox's own
// image is named: one started from an image someone else set on the Pod
// (a tenant who may edit Pods, between that edit and this placer setting
// the image back) is never used.
func podRef(sb *v1alpha1.Sandbox, pod *corev1.Pod) *v1alpha1.SandboxPod {
	ref := &v1alpha1.SandboxPod{Name: pod.Name, UID: string(pod.UID)}
	want := ""
	if b := bwrapImage(sb); b != nil {
		want = normalImage(b.Image)
		for _, c := range pod.Spec.Containers {
			if c.Name == podContainer && normalImage(c.Image) != want {
				return ref
			}
		}
	}
	for _, c := range pod.Status.ContainerStatuses {
		// An ID of another shape (a runtime that is not a CRI one) would
		// make the API refuse the whole status write: the Sandbox is then
		// placed, and waits for a container it can find.
		if c.Name != podContainer || c.State.Running == nil || !containerIDPattern.MatchString(c.ContainerID) {
			continue
		}
		if want != "" && !statusShows(c, want) {
			continue
		}
		ref.ContainerID = c.ContainerID
	}
	return ref
}

// statusShows says whether the container of status c runs image want (as
// normalImage spells it). A runtime reports an image without tags (one
// pulled by digest) by its ID, sha256:…, which names no image: the
// repository of the digest it records (imageID) must then be want's, and
// the digest too where want pins one. Taking any such ID as want let a
// tenant who set an image pinned by digest on the Pod have the node run
// the Sandbox over it.
func statusShows(c corev1.ContainerStatus, want string) bool {
	if !strings.HasPrefix(c.Image, "sha256:") {
		return normalImage(c.Image) == want
	}
	id := strings.TrimPrefix(c.ImageID, "docker-pullable://")
	if !strings.Contains(id, "@") {
		return false
	}
	got := normalImage(id)
	if strings.Contains(want, "@") {
		return got == want
	}
	repo, _, _ := strings.Cut(got, "@")
	return repo == want[:strings.LastIndex(want, ":")]
}

// normalImage is an image reference as the kubelet and containerd spell
// it: a registry (docker.io for none, with library/ for a one-part name)
// and a tag (latest for none, unless a digest pins it).
func normalImage(ref string) string {
	name, digest, pinned := strings.Cut(ref, "@")
	first, _, more := strings.Cut(name, "/")
	switch {
	case !more:
		name = "docker.io/library/" + name
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		name = "docker.io/" + name
	}
	if pinned {
		return name + "@" + digest
	}
	if !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		name += ":latest"
	}
	return name
}

// containerIDPattern is status.pod.containerID's schema pattern.
var containerIDPattern = regexp.MustCompile(`^[a-z0-9.-]+://[0-9a-f]{64}$`)

// podContainer is the name of the one container of a Sandbox's Pod.
const podContainer = "sandbox"

// The holder of a bwrap Sandbox's image: where the controller's image
// keeps it, the init container that copies it, and where the image's
// container finds it.
const (
	HolderPath      = "/usr/local/bin/sandbox-holder"
	holderContainer = "holder"
	holderVolume    = "sandbox-holder"
	holderMount     = "/.sandbox-holder"
)

// podsFound is what a Sandbox's Pods say.
type podsFound struct {
	// cur stands for the Sandbox now: the live Pod (neither deleted nor
	// ended) of the highest attempt.
	cur *corev1.Pod
	// stale are the other live Pods.
	stale []*corev1.Pod
	// ended are the Pods that ended and are not deleted yet.
	ended []*corev1.Pod
	// next is the attempt the next Pod takes.
	next int
	// lastNode is the node of the highest attempt that was bound: where a
	// Sandbox that stays belongs, by the placer's own record (the Pods it
	// made), not by status.nodeName, which a node's controller writes too.
	lastNode  string
	lastBound int
}

// sandboxPods sorts a Sandbox's Pods. Pods of another owner are left out:
// the label is only a hint, the owner reference decides.
func sandboxPods(sb *v1alpha1.Sandbox, pods []corev1.Pod) podsFound {
	f := podsFound{lastBound: -1}
	var live []*corev1.Pod
	for i := range pods {
		pod := &pods[i]
		if !podOwnedBy(pod, sb) {
			continue
		}
		k := podAttempt(pod)
		if k >= f.next {
			f.next = k + 1
		}
		if pod.Spec.NodeName != "" && k > f.lastBound {
			f.lastNode, f.lastBound = pod.Spec.NodeName, k
		}
		switch {
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			if pod.DeletionTimestamp.IsZero() {
				f.ended = append(f.ended, pod)
			}
		case !pod.DeletionTimestamp.IsZero():
		default:
			live = append(live, pod)
		}
	}
	for _, pod := range live {
		switch {
		case f.cur == nil:
			f.cur = pod
		case podAttempt(pod) > podAttempt(f.cur):
			f.stale, f.cur = append(f.stale, f.cur), pod
		default:
			f.stale = append(f.stale, pod)
		}
	}
	return f
}

// maxAttempt bounds the attempt numbers taken from Pods' annotations, which
// anyone who may write Pods in the namespace can set.
const maxAttempt = 1 << 20

// replaceWait is how much longer the placer waits before replacing the
// ended Pods: replaceAfter(attempt) from when the last of them ended (its
// Ready condition's last change, else its creation).
func replaceWait(ended []*corev1.Pod, attempt int, now time.Time) time.Duration {
	var last time.Time
	for _, pod := range ended {
		at := pod.CreationTimestamp.Time
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.LastTransitionTime.After(at) {
				at = c.LastTransitionTime.Time
			}
		}
		if at.After(last) {
			last = at
		}
	}
	return max(last.Add(replaceAfter(attempt)).Sub(now), 0)
}

// replaceAfter is how long the placer waits before replacing an ended Pod
// for the attempt-th time: a second, doubling to five minutes.
func replaceAfter(attempt int) time.Duration {
	return min(time.Second<<min(attempt, 9), 5*time.Minute)
}

// annotationPodAttempt numbers a Sandbox's Pods: each new one (after an
// eviction, say) takes the next number, and its name carries it.
const annotationPodAttempt = "sandbox.cireilclaw.dev/attempt"

func podAttempt(pod *corev1.Pod) int {
	k, err := strconv.Atoi(pod.Annotations[annotationPodAttempt])
	if err != nil || k < 0 || k > maxAttempt {
		return 0
	}
	return k
}

// SandboxPodName is the name of the Pod a Sandbox's attempt-th Pod takes:
// the Sandbox's name and "-sandbox", then "-<attempt>" after the first;
// a name too long for that is cut and given a hash of the whole.
func SandboxPodName(sandbox string, attempt int) string {
	base := sandbox
	if len(base) > 200 {
		sum := sha256.Sum256([]byte(sandbox))
		base = strings.TrimRight(base[:190], "-.") + "-" + hex.EncodeToString(sum[:])[:8]
	}
	name := base + "-sandbox"
	if attempt > 0 {
		name += "-" + strconv.Itoa(attempt)
	}
	return name
}

// SandboxPod is the Pod that stands for sb: the pause image with sb's
// resources as requests and limits, its scheduling fields, a required
// affinity to a node controller enabling its backend, and the tolerations
// its onNodeLost asks for. node binds it without the scheduler (pinned,
// or staying where it was); attempt numbers it.
func SandboxPod(sb *v1alpha1.Sandbox, o PlacementOptions, node string, attempt int) *corev1.Pod {
	o.defaults()
	res := sb.Spec.ResourcesOrDeprecated()
	reqs := corev1.ResourceRequirements{}
	add := func(list *corev1.ResourceList, name corev1.ResourceName, q *resource.Quantity) {
		if q == nil {
			return
		}
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[name] = q.DeepCopy()
	}
	add(&reqs.Requests, corev1.ResourceCPU, res.Requests.CPU)
	add(&reqs.Requests, corev1.ResourceMemory, res.Requests.Memory)
	add(&reqs.Limits, corev1.ResourceCPU, res.Limits.CPU)
	add(&reqs.Limits, corev1.ResourceMemory, res.Limits.Memory)

	affinity := sb.Spec.PodAffinity()
	if affinity == nil {
		affinity = &corev1.Affinity{}
	}
	if affinity.PodAffinity == nil {
		affinity.PodAffinity = &corev1.PodAffinity{}
	}
	affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution,
		corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				LabelBackendPrefix + string(sb.Spec.BackendOrDefault()): "true",
			}},
			Namespaces:  []string{o.SystemNamespace},
			TopologyKey: corev1.LabelHostname,
		})

	moves := sb.Spec.OnNodeLost == v1alpha1.NodeLostMove && sb.Spec.NodeName == ""
	var tolerations []corev1.Toleration
	for _, t := range sb.Spec.PodTolerations() {
		// A Sandbox that stays tolerates its node's loss for ever: a
		// shorter toleration of its own would have its Pod evicted and
		// bound to the lost node again, over and over.
		if !moves && (t.Key == "" || t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable) &&
			(t.Effect == "" || t.Effect == corev1.TaintEffectNoExecute) && t.TolerationSeconds != nil {
			continue
		}
		tolerations = append(tolerations, t)
	}
	var forHow *int64
	if moves {
		forHow = ptr.To(int64((o.NodeLostAfter + time.Second - 1) / time.Second))
	}
	for _, taint := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		tolerations = append(tolerations, corev1.Toleration{Key: taint, Operator: corev1.TolerationOpExists,
			Effect: corev1.TaintEffectNoExecute, TolerationSeconds: forHow})
	}

	restricted := func() *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(int64(65535)),
			RunAsGroup:               ptr.To(int64(65535)),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
	}
	main := corev1.Container{
		Name:            podContainer,
		Image:           o.PodImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Resources:       reqs,
		SecurityContext: restricted(),
	}
	var (
		inits   []corev1.Container
		volumes []corev1.Volume
		secrets []corev1.LocalObjectReference
	)
	if b := bwrapImage(sb); b != nil {
		// The image's container runs the holder, copied in by an init
		// container from the controller's image: nothing of the image
		// runs, whatever it holds (a shell or no libc at all).
		main.Image, main.ImagePullPolicy = b.Image, corev1.PullPolicy(b.ImagePullPolicy)
		main.Command = []string{holderMount + "/" + path.Base(HolderPath)}
		main.VolumeMounts = []corev1.VolumeMount{{Name: holderVolume, MountPath: holderMount, ReadOnly: true}}
		inits = []corev1.Container{{
			Name:            holderContainer,
			Image:           o.HolderImage,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Command:         []string{HolderPath, "install", holderMount},
			Resources:       reqs,
			SecurityContext: restricted(),
			VolumeMounts:    []corev1.VolumeMount{{Name: holderVolume, MountPath: holderMount}},
		}}
		volumes = []corev1.Volume{{Name: holderVolume, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("16Mi"))}}}}
		for _, n := range b.ImagePullSecrets {
			secrets = append(secrets, corev1.LocalObjectReference{Name: n})
		}
	}

	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: sb.Namespace,
			Name:      SandboxPodName(sb.Name, attempt),
			Labels: map[string]string{
				LabelSandboxPod:                "true",
				LabelSandboxUID:                string(sb.UID),
				"app.kubernetes.io/managed-by": "sandbox-controller",
			},
			Annotations: map[string]string{annotationPodAttempt: strconv.Itoa(attempt)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "Sandbox", Name: sb.Name, UID: sb.UID,
				Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			InitContainers:                inits,
			Containers:                    []corev1.Container{main},
			Volumes:                       volumes,
			ImagePullSecrets:              secrets,
			NodeName:                      node,
			NodeSelector:                  sb.Spec.NodeSelector,
			Affinity:                      affinity,
			Tolerations:                   tolerations,
			TopologySpreadConstraints:     sb.Spec.PodTopologySpreadConstraints(),
			PriorityClassName:             sb.Spec.PriorityClassName,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
		},
	}
}

// createPod makes sb's next Pod. It is bound without the scheduler when sb
// is pinned, or stays (onNodeLost: Stay) on the node its last Pod was
// bound to: its areas are there. A name another Pod holds (not this
// Sandbox's) is passed over for the next attempt's.
func (p *placer) createPod(ctx context.Context, sb *v1alpha1.Sandbox, found podsFound) (ctrl.Result, error) {
	// The Pod is made before any node checks the Sandbox against its
	// class: what it carries past its own placement is checked here.
	class, msg, err := p.classOf(ctx, sb)
	if err != nil {
		return ctrl.Result{}, err
	}
	if msg != "" {
		return p.notPlaced(ctx, sb, v1alpha1.ReasonClassForbids, msg)
	}
	if class != nil {
		if v := sandboxclass.Scheduling(class, &sb.Spec); len(v) > 0 {
			return p.notPlaced(ctx, sb, v1alpha1.ReasonClassForbids, strings.Join(v, "; "))
		}
	}
	if bwrapImage(sb) != nil && p.opts.HolderImage == "" {
		return p.notPlaced(ctx, sb, v1alpha1.ReasonPodRefused,
			"spec.bwrap.image: the aggregated API knows no holder image (--holder-image, the controller's own image), which the Pod of a bwrap Sandbox with an image needs")
	}
	node := sb.Spec.NodeName
	if node == "" && sb.Spec.OnNodeLost != v1alpha1.NodeLostMove {
		node = found.lastNode
	}
	for attempt := found.next; attempt < found.next+4; attempt++ {
		pod := SandboxPod(sb, p.opts, node, attempt)
		err = p.Create(ctx, pod)
		if err == nil {
			log.FromContext(ctx).Info("created the Sandbox's Pod", "pod", pod.Name, "node", node)
			return ctrl.Result{}, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			break
		}
		var held corev1.Pod
		if gerr := p.Get(ctx, client.ObjectKeyFromObject(pod), &held); gerr != nil {
			return ctrl.Result{}, client.IgnoreNotFound(gerr)
		}
		if podOwnedBy(&held, sb) {
			// Made by a pass the cache does not show yet.
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
	}
	switch {
	case apierrors.IsAlreadyExists(err):
		return p.notPlaced(ctx, sb, v1alpha1.ReasonPodRefused, fmt.Sprintf(
			"Pods named %s and the next ones belong to another owner: rename them, or the Sandbox", SandboxPodName(sb.Name, found.next)))
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
		// A ResourceQuota, a LimitRange, Pod Security admission or a
		// policy of the cluster's: in the API server's own words. Quota
		// frees up without an event the placer watches.
		why := "the API server refused the Sandbox's Pod: " + err.Error()
		if res, werr := p.notPlaced(ctx, sb, v1alpha1.ReasonPodRefused, why); werr != nil {
			return res, werr
		}
		return ctrl.Result{RequeueAfter: 15 * time.Second}, nil
	default:
		return ctrl.Result{}, err
	}
}

// classOf is sb's SandboxClass (nil when the cluster has none), or why it
// has none.
func (p *placer) classOf(ctx context.Context, sb *v1alpha1.Sandbox) (*v1alpha1.SandboxClass, string, error) {
	var classes v1alpha1.SandboxClassList
	if err := p.List(ctx, &classes); err != nil {
		return nil, "", fmt.Errorf("listing SandboxClasses: %w", err)
	}
	class, msg := sandboxclass.Select(classes.Items, &sb.Spec)
	return class, msg, nil
}

// schedulingForbidden is why sb's class refuses what its Pod pod carries
// past its placement, "" when it allows it or sb has no class. Both the
// Sandbox's spec and the Pod itself are checked: a Pod cannot drop a
// toleration, so one made before the spec let go of a toleration, a
// priority or an affinity still carries it.
func (p *placer) schedulingForbidden(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod) (string, error) {
	class, _, err := p.classOf(ctx, sb)
	if err != nil || class == nil {
		return "", err
	}
	why := sandboxclass.Scheduling(class, &sb.Spec)
	if len(why) == 0 {
		for _, w := range sandboxclass.Scheduling(class, p.podCarries(pod)) {
			why = append(why, "its Pod "+pod.Name+" carries "+w)
		}
	}
	return strings.Join(why, "; "), nil
}

// podCarries is what pod carries past its placement, as the spec of a
// Sandbox would ask it, less what the placer adds to every Pod (the
// backend's affinity term, the tolerations of a lost node, SandboxPod).
// Its node is left out: the placer pins a Pod to its Sandbox's last node
// itself.
func (p *placer) podCarries(pod *corev1.Pod) *v1alpha1.SandboxSpec {
	spec := &v1alpha1.SandboxSpec{PriorityClassName: pod.Spec.PriorityClassName}
	for _, t := range pod.Spec.Tolerations {
		if t.Operator == corev1.TolerationOpExists && t.Effect == corev1.TaintEffectNoExecute &&
			(t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable) {
			continue
		}
		spec.Tolerations = append(spec.Tolerations, v1alpha1.Toleration{Key: t.Key})
	}
	if a := pod.Spec.Affinity; a != nil {
		carried := &v1alpha1.Affinity{}
		if a.PodAntiAffinity != nil {
			carried.PodAntiAffinity = &v1alpha1.PodAffinity{}
		}
		if pa := a.PodAffinity; pa != nil && (len(pa.PreferredDuringSchedulingIgnoredDuringExecution) > 0 ||
			slices.ContainsFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution, func(t corev1.PodAffinityTerm) bool { return !p.backendTerm(t) })) {
			carried.PodAffinity = &v1alpha1.PodAffinity{}
		}
		spec.Affinity = carried
	}
	return spec
}

// backendTerm says whether t is the affinity term the placer gives every
// Pod: to a node whose controller enables the Sandbox's backend.
func (p *placer) backendTerm(t corev1.PodAffinityTerm) bool {
	if t.LabelSelector == nil || len(t.LabelSelector.MatchExpressions) > 0 || len(t.LabelSelector.MatchLabels) != 1 ||
		t.NamespaceSelector != nil || len(t.MatchLabelKeys) > 0 || len(t.MismatchLabelKeys) > 0 ||
		!slices.Equal(t.Namespaces, []string{p.opts.SystemNamespace}) || t.TopologyKey != corev1.LabelHostname {
		return false
	}
	for k, v := range t.LabelSelector.MatchLabels {
		return strings.HasPrefix(k, LabelBackendPrefix) && v == "true"
	}
	return false
}

// bwrapImage is sb's spec.bwrap when it names an image.
func bwrapImage(sb *v1alpha1.Sandbox) *v1alpha1.BwrapSpec {
	if b := sb.Spec.Bwrap; b != nil && b.Image != "" && sb.Spec.BackendOrDefault() == v1alpha1.BackendBwrap {
		return b
	}
	return nil
}

// podDrift says how pod, sb's Pod, falls behind sb's image: a new image
// is set in place (image is what to set; the kubelet restarts the
// container with it), any other difference (an image added or taken
// away, its pull policy, a secret the Pod lacks: a Pod cannot change
// them) needs a new Pod (replace). It compares the fields themselves:
// it runs on every pass of every Sandbox.
func (p *placer) podDrift(sb *v1alpha1.Sandbox, pod *corev1.Pod) (image string, replace bool) {
	b := bwrapImage(sb)
	hadHolder := len(pod.Spec.InitContainers) > 0
	if b == nil || !hadHolder {
		// An image taken away, or added.
		return "", hadHolder != (b != nil)
	}
	var cur *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == podContainer {
			cur = &pod.Spec.Containers[i]
		}
	}
	if cur == nil ||
		(b.ImagePullPolicy != "" && cur.ImagePullPolicy != corev1.PullPolicy(b.ImagePullPolicy)) ||
		slices.ContainsFunc(b.ImagePullSecrets, func(name string) bool {
			// The ServiceAccount's secrets are added to the Pod's.
			return !slices.Contains(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
		}) {
		return "", true
	}
	if cur.Image != b.Image {
		return b.Image, false
	}
	return "", false
}

func podOwnedBy(pod *corev1.Pod, sb *v1alpha1.Sandbox) bool {
	ref := sandboxController(pod)
	return ref != nil && ref.UID == sb.UID
}

// sandboxController is pod's controller when it is a Sandbox. Only such a
// reference is held to who may make it (config/admission's policy on
// Sandboxes' Pods); the UID alone is not: a controller of another kind
// may carry any UID, and anyone who may write Pods can give one.
func sandboxController(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "Sandbox" {
		return nil
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != v1alpha1.GroupVersion.Group {
		return nil
	}
	return ref
}

// pending reports a Pod the scheduler has not bound yet, in its words.
func (p *placer) pending(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod) (ctrl.Result, error) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
			return p.notPlaced(ctx, sb, v1alpha1.ReasonUnschedulable, fmt.Sprintf("Pod %s: %s", pod.Name, c.Message))
		}
	}
	// The scheduler has not looked yet, which takes moments: nothing to
	// say, and no write to pay for; the Pod's next change brings this back.
	return ctrl.Result{}, nil
}

// notPlaced says why sb has no node (yet): on sb, in an Event when that
// is news, and on its claims.
func (p *placer) notPlaced(ctx context.Context, sb *v1alpha1.Sandbox, reason, why string) (ctrl.Result, error) {
	f := placementFacts{generation: sb.Generation, outcome: unschedulable, reason: reason, why: why}
	if from := sb.Status.NodeName; from != "" {
		msg, lost := p.leftMessage(ctx, from)
		if !lost {
			// Its node runs it still (its Pod was preempted or deleted):
			// that node's controller reports it, and the placer only says
			// why no new Pod holds its room yet.
			p.recorder.Event(sb, "Warning", reason, boundedMessage(why))
			return ctrl.Result{}, nil
		}
		// Moving off a lost node: no other node can take it yet.
		f.outcome, f.lost, f.lostMsg = stranded, from, msg
	}
	read := sb.DeepCopy()
	applyConditions(&sb.Status.Conditions, placementConditions(f))
	if !equalStatus(read, sb) {
		if err := p.status.writeStatus(ctx, read, sb, unlessChanged); err != nil {
			return requeueOnConflict(err)
		}
		p.recorder.Event(sb, "Warning", reason, boundedMessage(why))
	}
	return p.markClaims(ctx, sb)
}

// placed records the node sb's Pod is bound to, and the Pod: that node's
// controller runs it from now on, in the Pod's cgroup. A Sandbox that had
// another node moved off it.
func (p *placer) placed(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod) (ctrl.Result, error) {
	node := pod.Spec.NodeName
	f := placementFacts{generation: sb.Generation, outcome: placedOn, node: node}
	if from := sb.Status.NodeName; from != "" {
		f.lostMsg, _ = p.leftMessage(ctx, from)
		f.outcome, f.lost = movedOff, from
	}
	read := sb.DeepCopy()
	sb.Status.NodeName, sb.Status.PlacedAt = node, &metav1.Time{Time: p.opts.Now()}
	sb.Status.Pod = podRef(sb, pod)
	applyConditions(&sb.Status.Conditions, placementConditions(f))
	// Only over the Sandbox as read: a node's controller that wrote first
	// wins, and this pass is retried.
	if err := p.status.writeStatus(ctx, read, sb, unlessChanged); err != nil {
		return requeueOnConflict(err)
	}
	log.FromContext(ctx).Info("placed Sandbox", "node", node, "from", f.lost)
	if f.outcome == movedOff {
		if c := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil {
			p.recorder.Event(sb, "Warning", c.Reason, c.Message)
		}
	}
	return ctrl.Result{}, nil
}

// nodeLost marks sb NodeLost while its node is not ready: it stays, or
// (Move) waits for its Pod's eviction. A node's controller that still runs
// and writes Ready after the node's loss has the last word: the placer
// does not write over a Ready condition newer than the loss, so the two
// never take turns.
func (p *placer) nodeLost(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod, n *corev1.Node, msg string) (ctrl.Result, error) {
	ready := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady)
	if ready != nil && ready.Reason == v1alpha1.ReasonNodeLost {
		return p.markClaims(ctx, sb)
	}
	if c := nodeReady(n); ready != nil && c != nil && ready.LastTransitionTime.After(c.LastTransitionTime.Time) {
		return ctrl.Result{}, nil
	}
	f := placementFacts{generation: sb.Generation, outcome: staysOn, lost: sb.Status.NodeName, lostMsg: msg, pinned: sb.Spec.NodeName != ""}
	if after, ok := evictedAfter(pod); ok && sb.Spec.OnNodeLost == v1alpha1.NodeLostMove && sb.Spec.NodeName == "" {
		f.outcome, f.evictAfter = evicting, after
	}
	read := sb.DeepCopy()
	applyConditions(&sb.Status.Conditions, placementConditions(f))
	if err := p.status.writeStatus(ctx, read, sb, unlessChanged); err != nil {
		return requeueOnConflict(err)
	}
	if c := findCondition(sb.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		p.recorder.Event(sb, "Warning", v1alpha1.ReasonNodeLost, c.Message)
	}
	return p.markClaims(ctx, sb)
}

// leftMessage says why a Sandbox's Pod left node from, and whether the
// node is lost: gone or not Ready, or the Pod went (evicted, preempted,
// deleted) while the node was fine.
func (p *placer) leftMessage(ctx context.Context, from string) (string, bool) {
	var n corev1.Node
	err := p.Get(ctx, client.ObjectKey{Name: from}, &n)
	switch c := nodeReady(&n); {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("node %s is gone (its Node was deleted)", from), true
	case err == nil && (c == nil || c.Status != corev1.ConditionTrue):
		return nodeLostMessage(&n, c), true
	}
	return fmt.Sprintf("its Pod left node %s", from), false
}

// evictedAfter is how long pod tolerates its node's loss before the taint
// evicts it: the shortest of its tolerations of the not-ready and
// unreachable taints (the Sandbox's own, or the placer's), as the taint
// eviction controller counts; false when it tolerates them for ever.
func evictedAfter(pod *corev1.Pod) (time.Duration, bool) {
	var least *int64
	for _, t := range pod.Spec.Tolerations {
		if t.Effect != "" && t.Effect != corev1.TaintEffectNoExecute || t.TolerationSeconds == nil {
			continue
		}
		if t.Key != "" && t.Key != corev1.TaintNodeNotReady && t.Key != corev1.TaintNodeUnreachable {
			continue
		}
		if least == nil || *t.TolerationSeconds < *least {
			least = t.TolerationSeconds
		}
	}
	if least == nil {
		return 0, false
	}
	return time.Duration(max(*least, 0)) * time.Second, true
}

// nodeLostMessage says since when and why a Node is not ready.
func nodeLostMessage(n *corev1.Node, c *corev1.NodeCondition) string {
	if c == nil {
		return fmt.Sprintf("node %s has not reported Ready", n.Name)
	}
	msg := fmt.Sprintf("node %s not Ready since %s (%s", n.Name, c.LastTransitionTime.UTC().Format(time.RFC3339), c.Reason)
	if c.Message != "" {
		msg += ": " + c.Message
	}
	return msg + ")"
}

func nodeReady(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func nodeReadyStatus(n *corev1.Node) corev1.ConditionStatus {
	if c := nodeReady(n); c != nil {
		return c.Status
	}
	return ""
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
// derives them again from what it finds.
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
	return a.Status.NodeName == b.Status.NodeName && equality.Semantic.DeepEqual(a.Status.Pod, b.Status.Pod) &&
		slices.EqualFunc(a.Status.Conditions, b.Status.Conditions, func(x, y metav1.Condition) bool {
			return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message
		})
}
