package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func lease(node string, renewed time.Duration, capacity, backends string) coordinationv1.Lease {
	return coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: NodeLeaseName(node), Annotations: map[string]string{AnnotationCapacity: capacity, AnnotationBackends: backends}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: t0.Add(-renewed)}},
	}
}

// seenWhenRenewed is a clock that read each Lease the moment it was
// renewed, as a coordinator does whose clock agrees with the nodes'.
func seenWhenRenewed(leases []coordinationv1.Lease) *leaseClock {
	c := &leaseClock{}
	for _, l := range leases {
		// Renewed once before, so the nodes take Sandboxes.
		c.lastChange(l.Name, &metav1.MicroTime{Time: l.Spec.RenewTime.Add(-10 * time.Second)}, l.Spec.RenewTime.Add(-10*time.Second))
		c.lastChange(l.Name, l.Spec.RenewTime, l.Spec.RenewTime.Time)
	}
	return c
}

func placed(node string, n int) []v1alpha1.Sandbox {
	var out []v1alpha1.Sandbox
	for range n {
		out = append(out, v1alpha1.Sandbox{Status: v1alpha1.SandboxStatus{NodeName: node}})
	}
	return out
}

func TestPlacementSpreadsOverLiveEligibleNodes(t *testing.T) {
	leases := []coordinationv1.Lease{
		lease("c", time.Second, "0", "bwrap"),
		lease("a", time.Second, "2", "bwrap"),
		lease("b", time.Second, "0", "bwrap,containerd"),
		lease("d", time.Minute, "0", "bwrap"), // lost: not renewed for 60s > 40s
	}
	nodes := []corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"zone": "1"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"zone": "2"}}},
		// c's Node has not been Ready for five minutes.
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(t0.Add(-5 * time.Minute))}}}},
	}
	sandboxes := append(placed("a", 1), placed("b", 3)...)
	v := buildView(leases, nodes, seenWhenRenewed(leases), "", t0, 40*time.Second)
	v.count(sandboxes, nil)

	if got := v.coordinator(); got != "a" {
		t.Errorf("coordinator %q, want a (the live node that sorts first)", got)
	}
	for name, lost := range map[string]bool{"a": false, "b": false, "c": true, "d": true} {
		if n := v.get(name); n.live() == lost {
			t.Errorf("node %s live=%v, want %v (%s)", name, n.live(), !lost, n.lostWhy)
		}
	}
	if !strings.Contains(v.get("c").lostWhy, "Node has not been Ready") || !strings.Contains(v.get("d").lostWhy, "Lease") {
		t.Errorf("why lost: c %q, d %q", v.get("c").lostWhy, v.get("d").lostWhy)
	}

	sb := &v1alpha1.Sandbox{}
	if got, why := v.choose(sb, ""); got != "a" {
		t.Errorf("placed on %q (%s), want a: the live node with the fewest", got, why)
	}
	// a fills up at its capacity of 2; then b, though it holds more.
	v.get("a").placed = 2
	if got, _ := v.choose(sb, ""); got != "b" {
		t.Errorf("with a full: placed on %q, want b", got)
	}
	sb.Spec.Backend = v1alpha1.BackendContainerd
	v.get("a").placed = 0
	if got, _ := v.choose(sb, ""); got != "b" {
		t.Errorf("containerd Sandbox placed on %q, want b, the only node enabling containerd", got)
	}
	sb.Spec.Backend = ""
	sb.Spec.NodeSelector = map[string]string{"zone": "2"}
	if got, _ := v.choose(sb, ""); got != "b" {
		t.Errorf("zone 2 placed on %q, want b", got)
	}
	if got, why := v.choose(sb, "b"); got != "" || !strings.Contains(why, "a: does not match nodeSelector") || !strings.Contains(why, "c: lost") {
		t.Errorf("zone 2 without b: %q, why %q", got, why)
	}
	sb.Spec.NodeSelector = map[string]string{"zone one": "2"}
	if got, why := v.choose(sb, ""); got != "" || !strings.Contains(why, `spec.nodeSelector: Invalid value: "zone one"`) {
		t.Errorf("a selector no label can carry: %q, why %q", got, why)
	}
	sb.Spec.NodeSelector = nil
	v.get("a").placed, v.get("b").capacity = 2, 3
	if got, why := v.choose(sb, ""); got != "" || !strings.Contains(why, "a: full (2 of 2)") || !strings.Contains(why, "b: full (3 of 3)") {
		t.Errorf("all full: %q, why %q", got, why)
	}
	if got, why := (nodeView{}).choose(sb, ""); got != "" || !strings.Contains(why, "no node controller has a live Lease") {
		t.Errorf("no nodes: %q, why %q", got, why)
	}
}

func TestPlacementCountsWhatItPlacedBeforeTheCacheShowsIt(t *testing.T) {
	leases := []coordinationv1.Lease{lease("a", 0, "0", "bwrap"), lease("b", 0, "0", "bwrap")}
	fresh := []v1alpha1.Sandbox{{ObjectMeta: metav1.ObjectMeta{UID: "1"}}, {ObjectMeta: metav1.ObjectMeta{UID: "2"}}}
	p := &placer{}
	p.recent = map[types.UID]recentPlacement{"1": {node: "a", at: t0}}
	clock := seenWhenRenewed(leases)
	v := buildView(leases, nil, clock, "", t0, 40*time.Second)
	v.count(fresh, p.nodeOf(t0))
	if got, _ := v.choose(&fresh[1], ""); got != "b" {
		t.Errorf("second of a burst placed on %q, want b: a has the first, which the cache does not show yet", got)
	}
	// A placement the cache never showed is forgotten after a minute.
	v = buildView(leases, nil, clock, "", t0.Add(2*time.Minute), 40*time.Second)
	v.count(fresh, p.nodeOf(t0.Add(2*time.Minute)))
	if v.get("a").placed != 0 {
		t.Errorf("a minute-old placement still counted")
	}
}

// Placements the cache shows are never looked up again: remember forgets
// the old ones, so the map holds only the last minute's.
func TestPlacementForgetsOldPlacements(t *testing.T) {
	p := &placer{}
	for i := range 100 {
		p.remember(types.UID(fmt.Sprint(i)), "a", t0)
	}
	p.remember("late", "b", t0.Add(2*recentFor))
	if len(p.recent) != 1 {
		t.Fatalf("%d placements remembered, want only the last minute's (1)", len(p.recent))
	}
}

// renewTime is written by the renewing node's clock: a node whose clock is
// ten minutes behind but renews on time is live, one whose clock is ten
// minutes ahead and stopped renewing is lost, both by this process's clock.
func TestNodeLossIsCountedByThisProcessClock(t *testing.T) {
	const d = 40 * time.Second
	clock := &leaseClock{}
	view := func(at time.Duration, behindRenewed, aheadRenewed time.Duration) nodeView {
		behind := lease("behind", 0, "0", "bwrap")
		behind.Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(-10*time.Minute + behindRenewed)}
		ahead := lease("ahead", 0, "0", "bwrap")
		ahead.Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(10*time.Minute + aheadRenewed)}
		return buildView([]coordinationv1.Lease{behind, ahead}, nil, clock, "", t0.Add(at), d)
	}
	// Both renew every 10s for half a minute; then ahead stops.
	for s := time.Duration(0); s <= 30*time.Second; s += 10 * time.Second {
		v := view(s, s, s)
		if !v.get("behind").live() || !v.get("ahead").live() {
			t.Fatalf("at %s: behind live %v (%s), ahead live %v; both renew on time", s, v.get("behind").live(), v.get("behind").lostWhy, v.get("ahead").live())
		}
	}
	for s := 40 * time.Second; s <= 60*time.Second; s += 10 * time.Second {
		v := view(s, s, 30*time.Second)
		if !v.get("behind").live() {
			t.Fatalf("at %s: behind lost (%s) though it renews on time", s, v.get("behind").lostWhy)
		}
		wantLost := s-30*time.Second > d
		if v.get("ahead").live() == wantLost {
			t.Fatalf("at %s: ahead live %v, want lost %v: it last renewed 30s in", s, v.get("ahead").live(), wantLost)
		}
	}
	v := view(80*time.Second, 80*time.Second, 30*time.Second)
	if got, want := v.get("ahead").lostSince, t0.Add(30*time.Second+d); !got.Equal(want) {
		t.Errorf("ahead lost since %s, want %s: a lease duration after this process last saw it renewed", got, want)
	}
	if !strings.Contains(v.get("ahead").lostWhy, "has not renewed its Lease since "+t0.Add(30*time.Second).Format(time.RFC3339)) {
		t.Errorf("why lost: %q", v.get("ahead").lostWhy)
	}
}

// A coordinator that just started has seen no renewal yet: every Lease
// counts as renewed when first read, and a silent one is lost a lease
// duration later. A Lease no longer listed is forgotten.
func TestNodeLossAfterAStartWaitsALeaseDuration(t *testing.T) {
	clock := &leaseClock{}
	silent := []coordinationv1.Lease{lease("a", time.Hour, "0", "bwrap")}
	if v := buildView(silent, nil, clock, "", t0, 40*time.Second); !v.get("a").live() {
		t.Fatalf("lost at the first read: %s", v.get("a").lostWhy)
	}
	if v := buildView(silent, nil, clock, "", t0.Add(41*time.Second), 40*time.Second); v.get("a").live() {
		t.Fatal("still live a lease duration after the first read, not renewed since")
	}
	buildView(nil, nil, clock, "", t0.Add(42*time.Second), 40*time.Second)
	if len(clock.seen) != 0 {
		t.Fatalf("%d Leases remembered after none was listed", len(clock.seen))
	}
}

// A node Sandboxes were placed on whose Lease is gone is lost once this
// process has missed the Lease for lostAfter; a node only named in
// spec.nodeName is not taken for one, nor is a node whose Lease is back.
func TestNodeWhoseLeaseIsGoneIsLost(t *testing.T) {
	const d = 40 * time.Second
	clock := &leaseClock{}
	leases := []coordinationv1.Lease{lease("a", 0, "0", "bwrap")}
	sandboxes := append(placed("a", 1), placed("gone", 2)...)
	sandboxes = append(sandboxes, v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{NodeName: "pinned"}, Status: v1alpha1.SandboxStatus{NodeName: "pinned"}})
	view := func(at time.Duration, leases []coordinationv1.Lease) nodeView {
		for i := range leases {
			leases[i].Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(at)} // renewing
		}
		v := buildView(leases, nil, clock, "a", t0.Add(at), d)
		v.addLeaseless(sandboxes, clock, t0.Add(at), d)
		return v
	}
	if v := view(0, leases); v.get("gone") != nil || v.get("pinned") != nil {
		t.Fatal("a node without a Lease was added at once: it would be lost before lostAfter")
	}
	v := view(41*time.Second, leases)
	if n := v.get("gone"); n == nil || n.live() || !strings.Contains(n.lostWhy, "Lease is gone") {
		t.Fatalf("gone after lostAfter: %+v, want lost because its Lease is gone", n)
	}
	if v.get("pinned") != nil {
		t.Error("a node named only in spec.nodeName counted lost")
	}
	if v.coordinator() != "a" {
		t.Errorf("coordinator %q, want a", v.coordinator())
	}
	if got, _ := v.choose(&v1alpha1.Sandbox{}, ""); got != "a" {
		t.Errorf("placed on %q, want a", got)
	}
	back := append(leases, lease("gone", 0, "0", "bwrap"))
	if n := view(42*time.Second, back).get("gone"); n == nil || !n.live() {
		t.Fatalf("its Lease is back: %+v, want live", n)
	}
	if len(clock.gone) != 0 {
		t.Errorf("%d missed Leases remembered after the Lease came back", len(clock.gone))
	}
}

// A coordinator that just started cannot tell by its own clock a node that
// renews from one that died just before: it places new Sandboxes only on
// itself, on nodes it has seen renew their Lease, and on nodes whose last
// renewTime is recent.
func TestAStartedCoordinatorPlacesNothingOnANodeThatStoppedBefore(t *testing.T) {
	clock := &leaseClock{}
	leases := func(at time.Duration) []coordinationv1.Lease {
		alive, self := lease("alive", 0, "0", "bwrap"), lease("self", 0, "0", "bwrap")
		alive.Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(at)}
		self.Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(at)}
		return []coordinationv1.Lease{alive, lease("dead", time.Minute, "0", "bwrap"), self}
	}
	v := buildView(leases(0), nil, clock, "self", t0, 40*time.Second)
	if !v.get("dead").live() {
		t.Fatal("dead is lost at the first read: it has a lease duration first")
	}
	v.get("alive").placed, v.get("self").placed = 1, 1
	if got, _ := v.choose(&v1alpha1.Sandbox{}, ""); got != "alive" {
		t.Fatalf("placed on %q, want alive (fewest but dead, which renewed a minute ago)", got)
	}
	v.get("alive").placed = 2
	if got, _ := v.choose(&v1alpha1.Sandbox{}, ""); got != "self" {
		t.Fatalf("placed on %q, want self", got)
	}
	if got, why := v.choose(&v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{NodeSelector: map[string]string{"none": "x"}}}, ""); got != "" || !strings.Contains(why, "dead: not seen renewing its Lease yet") {
		t.Fatalf("why not dead: %q", why)
	}
	v = buildView(leases(41*time.Second), nil, clock, "self", t0.Add(41*time.Second), 40*time.Second)
	if v.get("dead").live() || !v.get("alive").live() {
		t.Fatalf("a lease duration later: dead live %v, alive live %v", v.get("dead").live(), v.get("alive").live())
	}
}
