package controllers

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
)

func quantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// The Pod carries what the scheduler and the quota need, and nothing of
// privilege: Pod Security admission's restricted level takes it.
func TestSandboxPodCarriesTheSandbox(t *testing.T) {
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "alice", UID: "uid-1"},
		Spec: v1alpha1.SandboxSpec{
			Agent:   "alice",
			Backend: v1alpha1.BackendContainerd,
			Resources: &v1alpha1.Resources{
				Requests: v1alpha1.ResourceAmounts{CPU: quantity("250m"), Memory: quantity("256Mi")},
				Limits:   v1alpha1.ResourceAmounts{Memory: quantity("1Gi")},
			},
			NodeSelector:      map[string]string{"zone": "a"},
			Tolerations:       []v1alpha1.Toleration{{Key: "gpu", Operator: "Exists"}},
			PriorityClassName: "agents",
			Affinity: &v1alpha1.Affinity{PodAntiAffinity: &v1alpha1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1alpha1.PodAffinityTerm{{
				TopologyKey: corev1.LabelHostname, LabelSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]string{"x": "y"}},
			}}}},
			TopologySpreadConstraints: []v1alpha1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: "DoNotSchedule"}},
		},
	}
	pod := SandboxPod(sb, PlacementOptions{SystemNamespace: "sys"}, "", 2)
	if pod.Name != "alice-sandbox-2" || pod.Namespace != "team-a" {
		t.Errorf("pod %s/%s, want team-a/alice-sandbox-2", pod.Namespace, pod.Name)
	}
	if ref := metav1.GetControllerOf(pod); ref == nil || ref.UID != "uid-1" || ref.Kind != "Sandbox" {
		t.Errorf("controller reference %+v, want the Sandbox", ref)
	}
	c := pod.Spec.Containers[0]
	if c.Image != DefaultPodImage {
		t.Errorf("image %q, want %q", c.Image, DefaultPodImage)
	}
	if got := c.Resources.Requests.Memory().String(); got != "256Mi" {
		t.Errorf("memory request %s", got)
	}
	if got := c.Resources.Requests.Cpu().String(); got != "250m" {
		t.Errorf("cpu request %s", got)
	}
	if got := c.Resources.Limits.Memory().String(); got != "1Gi" {
		t.Errorf("memory limit %s", got)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Error("a cpu limit the Sandbox does not set")
	}
	sc := c.SecurityContext
	if sc == nil || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context %+v is not restricted", sc)
	}
	if *pod.Spec.AutomountServiceAccountToken {
		t.Error("the Pod mounts a service account token")
	}
	if pod.Spec.NodeName != "" || pod.Spec.NodeSelector["zone"] != "a" || pod.Spec.PriorityClassName != "agents" {
		t.Errorf("scheduling fields %q %v %q", pod.Spec.NodeName, pod.Spec.NodeSelector, pod.Spec.PriorityClassName)
	}
	if anti := pod.Spec.Affinity.PodAntiAffinity; anti == nil || len(anti.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		anti.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchLabels["x"] != "y" {
		t.Errorf("the Sandbox's anti-affinity is lost: %+v", anti)
	}
	if tsc := pod.Spec.TopologySpreadConstraints; len(tsc) != 1 || tsc[0].MaxSkew != 1 || tsc[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("topology spread constraints %+v", tsc)
	}
	terms := pod.Spec.Affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(terms) != 1 || terms[0].LabelSelector.MatchLabels[LabelBackendPrefix+"containerd"] != "true" ||
		len(terms[0].Namespaces) != 1 || terms[0].Namespaces[0] != "sys" || terms[0].TopologyKey != corev1.LabelHostname {
		t.Errorf("affinity to a node controller enabling containerd: %+v", terms)
	}
	if sb.Spec.Affinity.PodAffinity != nil {
		t.Error("building the Pod changed the Sandbox's affinity")
	}
	// The Sandbox's own toleration, and the two of node loss, for ever
	// (onNodeLost: Stay).
	if len(pod.Spec.Tolerations) != 3 || pod.Spec.Tolerations[0].Key != "gpu" {
		t.Fatalf("tolerations %+v", pod.Spec.Tolerations)
	}
	for _, tol := range pod.Spec.Tolerations[1:] {
		if tol.TolerationSeconds != nil || tol.Effect != corev1.TaintEffectNoExecute {
			t.Errorf("a Stay Sandbox's Pod tolerates %s for %v, want for ever", tol.Key, *tol.TolerationSeconds)
		}
	}
	if len(sb.Spec.Tolerations) != 1 {
		t.Error("building the Pod changed the Sandbox's tolerations")
	}
}

func TestSandboxPodOfAMoveSandboxIsEvictedAfterNodeLostAfter(t *testing.T) {
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}, Spec: v1alpha1.SandboxSpec{OnNodeLost: v1alpha1.NodeLostMove}}
	pod := SandboxPod(sb, PlacementOptions{NodeLostAfter: 1500 * time.Millisecond}, "", 0)
	if pod.Name != "a-sandbox" {
		t.Errorf("first Pod named %s", pod.Name)
	}
	keys := map[string]bool{}
	for _, tol := range pod.Spec.Tolerations {
		keys[tol.Key] = true
		if tol.TolerationSeconds == nil || *tol.TolerationSeconds != 2 {
			t.Errorf("%s tolerated for %v, want 2 s (rounded up)", tol.Key, tol.TolerationSeconds)
		}
	}
	if !keys[corev1.TaintNodeNotReady] || !keys[corev1.TaintNodeUnreachable] {
		t.Errorf("tolerations %v", keys)
	}
	// Pinned: it never moves, whatever onNodeLost says.
	sb.Spec.NodeName = "n1"
	pod = SandboxPod(sb, PlacementOptions{}, "n1", 0)
	if pod.Spec.NodeName != "n1" || pod.Spec.Tolerations[0].TolerationSeconds != nil {
		t.Errorf("pinned Pod: node %q, toleration %+v", pod.Spec.NodeName, pod.Spec.Tolerations[0])
	}
}

func TestSandboxPodNamesAreValid(t *testing.T) {
	for _, name := range []string{"a", strings.Repeat("b", 253), strings.Repeat("c.", 100) + "d"} {
		for _, attempt := range []int{0, 1, 12345} {
			got := SandboxPodName(name, attempt)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("SandboxPodName(%d chars, %d) = %q: %v", len(name), attempt, got, errs)
			}
		}
	}
	if SandboxPodName(strings.Repeat("b", 253), 0) == SandboxPodName(strings.Repeat("b", 252)+"c", 0) {
		t.Error("two long names cut to the same Pod name")
	}
}

// The Pod that stands for the Sandbox is its newest live one; another
// owner's Pod with the label is not its, whatever the label says, nor one
// whose controller carries its UID under another kind or group.
func TestSandboxPodsSortsTheSandboxsPods(t *testing.T) {
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}}
	mk := func(attempt int, mut func(*corev1.Pod)) corev1.Pod {
		p := *SandboxPod(sb, PlacementOptions{}, "", attempt)
		if mut != nil {
			mut(&p)
		}
		return p
	}
	now := metav1.Now()
	pods := []corev1.Pod{
		mk(0, func(p *corev1.Pod) { p.DeletionTimestamp = &now; p.Spec.NodeName = "n0" }),
		mk(1, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed; p.Spec.NodeName = "n1" }),
		mk(3, nil),
		mk(2, nil),
		mk(7, func(p *corev1.Pod) { p.OwnerReferences[0].UID = "someone-else"; p.Spec.NodeName = "n7" }),
		// A controller of another kind with the Sandbox's UID: the
		// admission policy on Sandboxes' Pods does not look at it.
		mk(8, func(p *corev1.Pod) {
			p.OwnerReferences[0].APIVersion, p.OwnerReferences[0].Kind = "example.test/v1", "Widget"
			p.Spec.NodeName = "n8"
		}),
		mk(9, func(p *corev1.Pod) { p.OwnerReferences[0].APIVersion = "example.test/v1alpha1"; p.Spec.NodeName = "n9" }),
		// Forged: an attempt past the bound counts as none.
		mk(0, func(p *corev1.Pod) {
			p.Name = "forged"
			p.Annotations[annotationPodAttempt] = "99999999999"
			p.Spec.NodeName = "n9"
		}),
	}
	f := sandboxPods(sb, pods)
	if f.cur == nil || f.cur.Name != "a-sandbox-3" {
		t.Errorf("current Pod %s, want a-sandbox-3", podName(f.cur))
	}
	if len(f.stale) != 2 {
		t.Errorf("stale Pods %d, want 2 (a-sandbox-2 and the forged one)", len(f.stale))
	}
	if f.next != 4 {
		t.Errorf("next attempt %d, want 4 (another owner's Pods do not count)", f.next)
	}
	if len(f.ended) != 1 || f.ended[0].Name != "a-sandbox-1" {
		t.Errorf("ended Pods %v, want a-sandbox-1", f.ended)
	}
	if f.lastNode != "n1" {
		t.Errorf("last bound node %q, want n1 (the highest attempt with a node; never another owner's)", f.lastNode)
	}
	f = sandboxPods(sb, pods[:2])
	if f.cur != nil || f.next != 2 {
		t.Errorf("with only a deleted and a failed Pod: current %v, next %d; want none and 2", f.cur, f.next)
	}
}

func podName(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return p.Name
}

// A Sandbox that stays keeps tolerating its node's loss for ever, whatever
// shorter toleration it asks for; one that moves keeps its own.
func TestStayIgnoresShorterTolerationsOfTheLoss(t *testing.T) {
	five := int64(5)
	own := []v1alpha1.Toleration{
		{Key: corev1.TaintNodeUnreachable, Operator: "Exists", Effect: "NoExecute", TolerationSeconds: &five},
		{Key: "gpu", Operator: "Exists"},
	}
	stay := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}, Spec: v1alpha1.SandboxSpec{Tolerations: own}}
	if after, evicted := evictedAfter(SandboxPod(stay, PlacementOptions{}, "", 0)); evicted {
		t.Errorf("a Stay Sandbox's Pod is evicted after %s", after)
	}
	if got := SandboxPod(stay, PlacementOptions{}, "", 0).Spec.Tolerations; got[0].Key != "gpu" {
		t.Errorf("the Sandbox's other tolerations are lost: %+v", got)
	}
	move := stay.DeepCopy()
	move.Spec.OnNodeLost = v1alpha1.NodeLostMove
	if after, evicted := evictedAfter(SandboxPod(move, PlacementOptions{}, "", 0)); !evicted || after != 5*time.Second {
		t.Errorf("a Move Sandbox's Pod is evicted after %s (%v), want its own 5s", after, evicted)
	}
}

func TestReplaceAfterBacksOff(t *testing.T) {
	if replaceAfter(0) != time.Second || replaceAfter(3) != 8*time.Second || replaceAfter(50) != 5*time.Minute || replaceAfter(maxAttempt) != 5*time.Minute {
		t.Errorf("replaceAfter: %s %s %s", replaceAfter(0), replaceAfter(3), replaceAfter(50))
	}
}

// What the message says of eviction is what the taint eviction does: the
// shortest toleration of the loss, the Sandbox's own or the placer's.
func TestEvictedAfterIsTheShortestToleration(t *testing.T) {
	five, forty := int64(5), int64(40)
	for _, tc := range []struct {
		name  string
		tols  []corev1.Toleration
		want  time.Duration
		evict bool
	}{
		{"for ever", []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}, 0, false},
		{"placer's", []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &forty}}, 40 * time.Second, true},
		{"the Sandbox's shorter one", []corev1.Toleration{
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &five},
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &forty}}, 5 * time.Second, true},
		{"another taint's", []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &five}}, 0, false},
		{"NoSchedule only", []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: &five}}, 0, false},
	} {
		got, evict := evictedAfter(&corev1.Pod{Spec: corev1.PodSpec{Tolerations: tc.tols}})
		if got != tc.want || evict != tc.evict {
			t.Errorf("%s: evictedAfter = %s, %v; want %s, %v", tc.name, got, evict, tc.want, tc.evict)
		}
	}
}

// The wait before an ended Pod is replaced is counted from when it ended,
// so the event of its deletion cannot cut it short.
func TestReplaceWaitCountsFromTheEnd(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ended := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(now.Add(-3 * time.Second))}}}}
	if got := replaceWait([]*corev1.Pod{ended}, 3, now); got != 5*time.Second {
		t.Errorf("attempt 3, ended 3 s ago: wait %s, want 5s (8 s from the end)", got)
	}
	if got := replaceWait([]*corev1.Pod{ended}, 1, now); got != 0 {
		t.Errorf("attempt 1, ended 3 s ago: wait %s, want none", got)
	}
	// Without a Ready condition, from its creation.
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}}
	if got := replaceWait([]*corev1.Pod{old}, 3, now); got != 0 {
		t.Errorf("created an hour ago: wait %s, want none", got)
	}
}

func TestNormalImage(t *testing.T) {
	for in, want := range map[string]string{
		"python:3":                             "docker.io/library/python:3",
		"python":                               "docker.io/library/python:latest",
		"team/tools":                           "docker.io/team/tools:latest",
		"localhost/sandbox-controller/py:test": "localhost/sandbox-controller/py:test",
		"registry.example.com:5000/a/b":        "registry.example.com:5000/a/b:latest",
		"registry.example.com/a/b:1.2":         "registry.example.com/a/b:1.2",
		"python@sha256:abcd":                   "docker.io/library/python@sha256:abcd",
	} {
		if got := normalImage(in); got != want {
			t.Errorf("normalImage(%q) = %q, want %q", in, got, want)
		}
	}
}

// The container of a bwrap Sandbox's image is named only while it runs
// the Sandbox's image: one someone else set on the Pod never is.
func TestPodRefNamesOnlyAContainerOfTheSandboxsImage(t *testing.T) {
	const id = "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	sb := &v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{Bwrap: &v1alpha1.BwrapSpec{Image: "python:3"}}}
	pod := func(spec, status, imageID string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: podContainer, Image: spec}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: podContainer, Image: status, ImageID: imageID, ContainerID: id,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		}
	}
	pinned := &v1alpha1.Sandbox{Spec: v1alpha1.SandboxSpec{Bwrap: &v1alpha1.BwrapSpec{Image: "python@sha256:aaaa"}}}
	for _, tc := range []struct {
		name                  string
		sb                    *v1alpha1.Sandbox
		spec, status, imageID string
		named                 bool
	}{
		{"its image", sb, "python:3", "docker.io/library/python:3", "", true},
		{"its image, reported by its ID", sb, "python:3", "sha256:0123", "docker.io/library/python@sha256:aaaa", true},
		{"its image pinned by digest, reported by its ID", pinned, "python@sha256:aaaa", "sha256:0123", "docker.io/library/python@sha256:aaaa", true},
		{"another digest of its repository where it pins one", pinned, "python@sha256:aaaa", "sha256:0123", "docker.io/library/python@sha256:bbbb", false},
		{"another image set on the Pod", sb, "evil:1", "docker.io/library/evil:1", "", false},
		{"set back, the other image still running", sb, "python:3", "docker.io/library/evil:1", "", false},
		{"set back, another image pinned by digest still running, reported by its ID", sb, "python:3", "sha256:0123", "registry.example/evil@sha256:bbbb", false},
		{"reported by an ID that names no repository", sb, "python:3", "sha256:0123", "sha256:0123", false},
	} {
		got := podRef(tc.sb, pod(tc.spec, tc.status, tc.imageID)).ContainerID
		if (got == id) != tc.named {
			t.Errorf("%s: container ID %q, named: want %v", tc.name, got, tc.named)
		}
	}
	plain := &v1alpha1.Sandbox{}
	if podRef(plain, pod("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10", "")).ContainerID != id {
		t.Error("a Sandbox without an image: its Pod's container is not named")
	}
}

// What a Pod carries past its placement is what its Sandbox's spec asked,
// never what the placer adds to every Pod: a class that allows nothing of
// the kind must not see the placer's own affinity term or tolerations,
// or it would remove every Pod it finds, and make it again, for ever.
func TestPodCarriesWhatTheSpecAsked(t *testing.T) {
	class := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "narrow"}}
	o := PlacementOptions{}
	o.defaults()
	p := &placer{opts: o}
	for _, tc := range []struct {
		name string
		spec v1alpha1.SandboxSpec
		want int
	}{
		{"nothing", v1alpha1.SandboxSpec{}, 0},
		{"moves", v1alpha1.SandboxSpec{OnNodeLost: v1alpha1.NodeLostMove}, 0},
		{"a shorter toleration of its node's loss", v1alpha1.SandboxSpec{OnNodeLost: v1alpha1.NodeLostMove, Tolerations: []v1alpha1.Toleration{
			{Key: corev1.TaintNodeUnreachable, Operator: "Exists", Effect: "NoExecute", TolerationSeconds: new(int64(5))}}}, 0},
		{"node affinity", v1alpha1.SandboxSpec{Affinity: &v1alpha1.Affinity{NodeAffinity: &v1alpha1.NodeAffinity{}}}, 0},
		{"a toleration", v1alpha1.SandboxSpec{Tolerations: []v1alpha1.Toleration{{Key: "gpu", Operator: "Exists"}}}, 1},
		{"every taint", v1alpha1.SandboxSpec{Tolerations: []v1alpha1.Toleration{{Operator: "Exists"}}}, 1},
		{"a priority", v1alpha1.SandboxSpec{PriorityClassName: "agents"}, 1},
		{"affinity to other Pods", v1alpha1.SandboxSpec{Affinity: &v1alpha1.Affinity{PodAffinity: &v1alpha1.PodAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []v1alpha1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: v1alpha1.PodAffinityTerm{TopologyKey: "zone"}}}}}}, 1},
		{"a required term like the placer's own", v1alpha1.SandboxSpec{Affinity: &v1alpha1.Affinity{PodAffinity: &v1alpha1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []v1alpha1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname,
				LabelSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, Namespaces: []string{o.SystemNamespace}}}}}}, 1},
		{"anti-affinity", v1alpha1.SandboxSpec{Affinity: &v1alpha1.Affinity{PodAntiAffinity: &v1alpha1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []v1alpha1.PodAffinityTerm{{TopologyKey: "zone"}}}}}, 1},
		{"all of them", v1alpha1.SandboxSpec{PriorityClassName: "agents", Tolerations: []v1alpha1.Toleration{{Key: "gpu"}, {Key: "b"}},
			Affinity: &v1alpha1.Affinity{PodAntiAffinity: &v1alpha1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1alpha1.PodAffinityTerm{{TopologyKey: "zone"}}}}}, 4},
	} {
		for _, node := range []string{"", "n1"} {
			sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "a", UID: "u"}, Spec: tc.spec}
			pod := SandboxPod(sb, o, node, 0)
			got := sandboxclass.Scheduling(class, p.podCarries(pod))
			if len(got) != tc.want {
				t.Errorf("%s, node %q: the Pod carries %q, want %d refusals", tc.name, node, got, tc.want)
			}
			// Never more than its spec: tolerations of the node's loss
			// are the placer's own on every Pod, whoever asked.
			if want := sandboxclass.Scheduling(class, &tc.spec); len(got) > len(want) {
				t.Errorf("%s, node %q: the Pod is refused %q, its spec only %q", tc.name, node, got, want)
			}
		}
	}
}
