package controllers

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// pair is a Ready Sandbox and its claim as the API server sends them, the
// status as the controller writes it.
func pair(t testing.TB, i int) (sandbox, claim []byte) {
	t.Helper()
	now := metav1.NewTime(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	mem := resource.MustParse("1Mi")
	name := fmt.Sprintf("agent-%05d", i)
	cond := func(typ, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: now, ObservedGeneration: 1}
	}
	managed := []metav1.ManagedFieldsEntry{{Manager: "sandbox-controller", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"}}
	sb := v1alpha1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: types.UID(fmt.Sprintf("uid-sandbox-%08d", i)), ResourceVersion: fmt.Sprint(1000 + i),
			Generation: 1, CreationTimestamp: now, Finalizers: []string{v1alpha1.Finalizer}, ManagedFields: managed},
		Spec: v1alpha1.SandboxSpec{Agent: "team-a-" + name, Backend: v1alpha1.BackendBwrap, Binaries: []v1alpha1.BinaryName{"git"}},
		Status: v1alpha1.SandboxStatus{ObservedGeneration: 1, Claims: 1, Instance: v1alpha1.InstanceName("team-a-" + name), NodeName: "node-1",
			Usage: &v1alpha1.SandboxUsage{Memory: &mem, Processes: 1},
			Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionSandboxEnforced, v1alpha1.ReasonEnforced, "the bwrap policy holds: namespaces, seccomp, no new privileges"),
				cond(v1alpha1.ConditionRuntimeReady, v1alpha1.ReasonRunning, "the instance is running"),
				cond(v1alpha1.ConditionReady, v1alpha1.ReasonRunning, "the instance is running with 1 claim"),
			}},
	}
	cl := v1alpha1.SessionClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SessionClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-session", Namespace: "team-a", UID: types.UID(fmt.Sprintf("uid-claim-%08d", i)), ResourceVersion: fmt.Sprint(2000 + i),
			Generation: 1, CreationTimestamp: now, Finalizers: []string{v1alpha1.Finalizer}, ManagedFields: managed},
		Spec: v1alpha1.SessionClaimSpec{SandboxName: name, Session: "s-" + name},
		Status: v1alpha1.SessionClaimStatus{ObservedGeneration: 1, Instance: sb.Status.Instance, Endpoint: "https://10.0.0.1:9443",
			Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionBound, v1alpha1.ReasonBound, "bound to Sandbox "+name),
				cond(v1alpha1.ConditionReady, v1alpha1.ReasonRunning, "Sandbox "+name+" is running"),
			}},
	}
	var err error
	if sandbox, err = json.Marshal(&sb); err != nil {
		t.Fatal(err)
	}
	if claim, err = json.Marshal(&cl); err != nil {
		t.Fatal(err)
	}
	return sandbox, claim
}

// stripOnly is the caches' transform before strings were shared.
func stripOnly() func(any) (any, error) { return cache.TransformStripManagedFields() }

// cached decodes data into obj and passes it through the caches' transform.
func cached[T any](t testing.TB, transform func(any) (any, error), data []byte, obj *T) *T {
	t.Helper()
	if err := json.Unmarshal(data, obj); err != nil {
		t.Fatal(err)
	}
	out, err := transform(obj)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*T)
}

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// Two cached Sandboxes and two cached claims, decoded apart and with
// garbage collections between them, hold one copy of each string they
// have alike; what is an object's own stays its own, and the managed
// fields are gone.
func TestCachedObjectsShareTheStringsTheyHaveAlike(t *testing.T) {
	transform := CacheTransform()
	sb1, cl1 := pair(t, 1)
	sb2, cl2 := pair(t, 2)
	a := cached(t, transform, sb1, &v1alpha1.Sandbox{})
	c := cached(t, transform, cl1, &v1alpha1.SessionClaim{})
	runtime.GC()
	runtime.GC()
	b := cached(t, transform, sb2, &v1alpha1.Sandbox{})
	d := cached(t, transform, cl2, &v1alpha1.SessionClaim{})

	shared := map[string][2]string{
		"apiVersion":  {a.APIVersion, d.APIVersion},
		"namespace":   {a.Namespace, d.Namespace},
		"finalizer":   {a.Finalizers[0], d.Finalizers[0]},
		"backend":     {string(a.Spec.Backend), string(b.Spec.Backend)},
		"binary":      {string(a.Spec.Binaries[0]), string(b.Spec.Binaries[0])},
		"node":        {a.Status.NodeName, b.Status.NodeName},
		"endpoint":    {c.Status.Endpoint, d.Status.Endpoint},
		"type":        {a.Status.Conditions[2].Type, d.Status.Conditions[1].Type},
		"reason":      {a.Status.Conditions[1].Reason, d.Status.Conditions[1].Reason},
		"status":      {string(a.Status.Conditions[0].Status), string(d.Status.Conditions[0].Status)},
		"its message": {a.Status.Conditions[0].Message, b.Status.Conditions[0].Message},
	}
	for what, s := range shared {
		if s[0] != s[1] {
			t.Fatalf("%s: the test's objects differ: %q, %q", what, s[0], s[1])
		}
		if !sameString(s[0], s[1]) {
			t.Errorf("%s %q: each cached object holds a copy of its own", what, s[0])
		}
	}
	if a.Kind != "Sandbox" || d.Kind != "SessionClaim" || a.Name == b.Name || c.Status.Conditions[0].Message == d.Status.Conditions[0].Message {
		t.Errorf("the objects' own fields changed: %s %s, %s %s", a.Kind, a.Name, d.Kind, b.Name)
	}
	for _, o := range []metav1.Object{a, b, c, d} {
		if len(o.GetManagedFields()) != 0 {
			t.Errorf("%s kept its managed fields in the cache", o.GetName())
		}
	}
}

// The table of shared strings stays within its bound however many
// different strings pass through it, and shares again after emptying.
func TestSharedStringsAreBounded(t *testing.T) {
	tab := &stringTable{held: map[string]string{}}
	for i := range 3 * stringTableMax {
		tab.intern(fmt.Sprintf("an error's message %d", i))
		if len(tab.held) > stringTableMax {
			t.Fatalf("the table holds %d strings, past its bound of %d", len(tab.held), stringTableMax)
		}
	}
	first := tab.intern(string([]byte("Ready")))
	if again := tab.intern(string([]byte("Ready"))); !sameString(first, again) {
		t.Error("after emptying, the table no longer shares")
	}
}

// BenchmarkCachedPair reports the heap a cached Sandbox and its claim
// hold, through the caches' transform and through the managed fields'
// stripping alone.
func BenchmarkCachedPair(b *testing.B) {
	const n = 2000
	raw := make([][2][]byte, n)
	for i := range raw {
		raw[i][0], raw[i][1] = pair(b, i)
	}
	for _, tc := range []struct {
		name      string
		transform func(any) (any, error)
	}{{"strip-only", stripOnly()}, {"cache-transform", CacheTransform()}} {
		b.Run(tc.name, func(b *testing.B) {
			var live float64
			for range b.N {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				kept := make([]any, 0, 2*n)
				for _, r := range raw {
					kept = append(kept, cached(b, tc.transform, r[0], &v1alpha1.Sandbox{}), cached(b, tc.transform, r[1], &v1alpha1.SessionClaim{}))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				live += float64(after.HeapAlloc) - float64(before.HeapAlloc)
				runtime.KeepAlive(kept)
			}
			b.ReportMetric(live/float64(b.N)/n, "heap-bytes/pair")
		})
	}
}
