package controllers

import (
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// CacheTransform prepares an object for the informer caches: it drops the
// managed fields (the controller never reads them) and, for Sandboxes and
// claims, makes the strings that many of them hold alike one shared copy.
// Decoding gives every object its own copy of each string: the conditions'
// types, reasons and a Sandbox's messages, the finalizer, the namespace,
// the type's group and kind, the binaries, the node, a claim's endpoint.
// Only strings that many objects hold are shared: a string held once
// would cost its entry in the table and save nothing. Strings are never
// written in place, so the cached objects can share them.
func CacheTransform() toolscache.TransformFunc {
	strip := cache.TransformStripManagedFields()
	t := &stringTable{held: map[string]string{}}
	intern := t.intern
	internAll := func(ss []string) {
		for i, s := range ss {
			ss[i] = intern(s)
		}
	}
	internMeta := func(tm *metav1.TypeMeta, m *metav1.ObjectMeta) {
		tm.APIVersion, tm.Kind = intern(tm.APIVersion), intern(tm.Kind)
		m.Namespace = intern(m.Namespace)
		internAll(m.Finalizers)
		for i := range m.OwnerReferences {
			r := &m.OwnerReferences[i]
			r.APIVersion, r.Kind = intern(r.APIVersion), intern(r.Kind)
		}
	}
	// internConditions shares the conditions' types, statuses and
	// reasons, and their messages where those are alike from object to
	// object (a Sandbox's; a claim's name its Sandbox).
	internConditions := func(cs []metav1.Condition, messages bool) {
		for i := range cs {
			c := &cs[i]
			c.Type, c.Reason = intern(c.Type), intern(c.Reason)
			c.Status = metav1.ConditionStatus(intern(string(c.Status)))
			if messages {
				c.Message = intern(c.Message)
			}
		}
	}
	return func(in any) (any, error) {
		out, err := strip(in)
		if err != nil {
			return out, err
		}
		switch o := out.(type) {
		case *v1alpha1.Sandbox:
			internMeta(&o.TypeMeta, &o.ObjectMeta)
			for i, b := range o.Spec.Binaries {
				o.Spec.Binaries[i] = v1alpha1.BinaryName(intern(string(b)))
			}
			o.Spec.Backend = v1alpha1.Backend(intern(string(o.Spec.Backend)))
			o.Status.NodeName = intern(o.Status.NodeName)
			internConditions(o.Status.Conditions, true)
		case *v1alpha1.SessionClaim:
			internMeta(&o.TypeMeta, &o.ObjectMeta)
			o.Status.Endpoint = intern(o.Status.Endpoint)
			internConditions(o.Status.Conditions, false)
		}
		return out, nil
	}
}

// stringTable holds one copy of each string shared so far. It holds them
// itself, so that an object decoded after a garbage collection shares the
// copy of one decoded before (a table of weak references, Go's unique,
// would have let the copy go as soon as nothing but objects held it). It
// is bounded, and emptied when full, so that values no object holds any
// more (an old error's message) are not kept for ever: after that, sharing
// starts again from the next objects decoded.
type stringTable struct {
	mu   sync.Mutex
	held map[string]string
}

// stringTableMax bounds the table: far more than the conditions, reasons,
// namespaces and nodes of a cluster, a few hundred KiB at most.
const stringTableMax = 4096

func (t *stringTable) intern(s string) string {
	if s == "" {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.held[s]; ok {
		return c
	}
	if len(t.held) >= stringTableMax {
		clear(t.held)
	}
	// A copy of its own: the table must not keep alive whatever larger
	// buffer s may be a part of.
	c := strings.Clone(s)
	t.held[c] = c
	return c
}
