package controllers

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// usageOf is a runtime that reports usage and nothing else: the usage
// watcher calls no other method.
type usageOf struct{ runtimes.Runtime }

func (usageOf) Usage(name string) (runtimes.Usage, error) {
	return runtimes.Usage{Pids: int64(len(name))}, nil
}

// A scrape and every interval read each Sandbox of the node from the
// informer's own store: the cache's objects, not a list of copies of
// every one (0.7 KiB a Sandbox, at each scrape).
func TestUsageReadsTheCachedSandboxesWithoutCopyingThem(t *testing.T) {
	const n = 1000
	store := toolscache.NewStore(toolscache.MetaNamespaceKeyFunc)
	cached := map[string]*v1alpha1.Sandbox{}
	owners := &instanceOwners{}
	for i := range n {
		sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: fmt.Sprintf("sb-%04d", i), UID: types.UID(fmt.Sprint(i))},
			Spec: v1alpha1.SandboxSpec{Agent: fmt.Sprintf("agent-%04d", i)}}
		if i%2 == 1 {
			// Another node's: not this watcher's to report.
			sb.Status.NodeName = "elsewhere"
		}
		if err := store.Add(sb); err != nil {
			t.Fatal(err)
		}
		cached[sb.Name] = sb
		owners.set(sb.Spec.Agent, sb.UID)
	}
	w := &usageWatcher{store: store, runtimes: map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: usageOf{}}, owners: owners}

	seen := 0
	w.each(func(sb *v1alpha1.Sandbox, u runtimes.Usage) {
		seen++
		if sb != cached[sb.Name] {
			t.Fatalf("Sandbox %s is a copy, not the cache's object", sb.Name)
		}
		if sb.Status.NodeName != "" {
			t.Fatalf("Sandbox %s of node %q reported by a watcher of no node", sb.Name, sb.Status.NodeName)
		}
		if want := int64(len(v1alpha1.InstanceName(sb.Spec.Agent))); u.Pids != want {
			t.Fatalf("Sandbox %s: usage %+v, want the runtime's for its instance (%d)", sb.Name, u, want)
		}
	})
	if seen != n/2 {
		t.Fatalf("%d Sandboxes reported, want this node's %d", seen, n/2)
	}

	// The store's list is a pointer a Sandbox (16 B); a List of the
	// cache, even without deep copies, copies every Sandbox's struct.
	stats := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w.each(func(*v1alpha1.Sandbox, runtimes.Usage) {})
		}
	})
	if perSandbox := stats.AllocedBytesPerOp() / n; perSandbox > 64 {
		t.Fatalf("a pass over %d Sandboxes allocates %d B (%d B a Sandbox): it copies them", n, stats.AllocedBytesPerOp(), perSandbox)
	}
}
