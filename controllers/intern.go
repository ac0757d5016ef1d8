package controllers

import (
	"unique"

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
	return func(in any) (any, error) {
		out, err := strip(in)
		if err != nil {
			return out, err
		}
		switch o := out.(type) {
		case *v1alpha1.Sandbox:
			internMeta(&o.TypeMeta, &o.ObjectMeta)
			internAll(o.Spec.Binaries)
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

func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

func internAll[S ~string](ss []S) {
	for i, s := range ss {
		ss[i] = S(intern(string(s)))
	}
}

func internMeta(t *metav1.TypeMeta, m *metav1.ObjectMeta) {
	t.APIVersion, t.Kind = intern(t.APIVersion), intern(t.Kind)
	m.Namespace = intern(m.Namespace)
	internAll(m.Finalizers)
	for i := range m.OwnerReferences {
		r := &m.OwnerReferences[i]
		r.APIVersion, r.Kind = intern(r.APIVersion), intern(r.Kind)
	}
}

// internConditions shares the conditions' types, statuses and reasons,
// and their messages where those are alike from object to object (a
// Sandbox's; a claim's name its Sandbox, and a string held once gains
// nothing from the table but costs its entry).
func internConditions(cs []metav1.Condition, messages bool) {
	for i := range cs {
		c := &cs[i]
		c.Type, c.Reason = intern(c.Type), intern(c.Reason)
		c.Status = metav1.ConditionStatus(intern(string(c.Status)))
		if messages {
			c.Message = intern(c.Message)
		}
	}
}
