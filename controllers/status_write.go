package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// Every status write of a Sandbox or a SessionClaim goes through
// writeStatus: the reconcilers, the placer and the claim release all
// derive conditions from facts (sandboxConditions, placementConditions,
// claimConditions), set them on the object, and hand writeStatus the
// object as read and as it should be. Nothing else calls Status().

// writeMode says what a write does when the object changed since it was
// read.
type writeMode int

const (
	// mergeConditions keeps what another writer did meanwhile: the
	// conditions this pass changed (set or removed, by type) go onto the
	// stored list, which the API declares a map list keyed by type, and
	// the other fields this pass changed go as they are. Where the
	// conditions have another writer (shared: the placer, on a cluster),
	// the write carries the resourceVersion when conditions changed, so
	// that a list read stale never replaces a newer one; on a conflict it
	// reads the object again, uncached, and merges again. Without one, the
	// list this process read is the stored one, or older only by its own
	// writes, which the pass derives again.
	mergeConditions writeMode = iota
	// unlessChanged writes only over the object as read: a conflict is
	// returned, for the caller to requeue and decide again against what
	// the other writer did (the placer: a node's controller that wrote
	// first wins).
	unlessChanged
)

// mergeAttempts bounds the merges after conflicts in one write.
const mergeAttempts = 5

// statusWriter writes the status of Sandboxes and SessionClaims.
type statusWriter struct {
	client client.Client
	// reader reads an object again after a conflict, past the cache; nil
	// means client.
	reader client.Reader
	// shared says the conditions have another writer: on a cluster, the
	// placer writes Ready while no node runs a Sandbox, and a claim's.
	shared bool
}

// writeStatus sends what changed in after's status since before (the
// object as the pass read it), and nothing at all when nothing changed,
// so steady-state passes write nothing. after then holds the stored
// object. An object deleted meanwhile is not an error.
func (w statusWriter) writeStatus(ctx context.Context, before, after client.Object, mode writeMode) error {
	patch, err := statusPatch(before, after)
	if err != nil || patch == nil {
		return err
	}
	changes := conditionDiff(conditionsOf(before), conditionsOf(after))
	lock := mode == unlessChanged || (w.shared && len(changes) > 0)
	for attempt := 1; ; attempt++ {
		err := w.send(ctx, after, patch, lock)
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err) || mode == unlessChanged || attempt == mergeAttempts:
			return fmt.Errorf("writing status of %T %s/%s: %w", after, after.GetNamespace(), after.GetName(), err)
		}
		if err := w.rebase(ctx, after, patch, changes); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
}

// send patches the status with patch, stamped with after's
// resourceVersion when lock is set.
func (w statusWriter) send(ctx context.Context, after client.Object, patch map[string]any, lock bool) error {
	body := map[string]any{"status": patch}
	if lock {
		body["metadata"] = map[string]any{"resourceVersion": after.GetResourceVersion()}
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return w.client.Status().Patch(ctx, after, client.RawPatch(types.MergePatchType, data))
}

// rebase reads the stored object into after and puts this pass's
// condition changes onto its list in patch.
func (w statusWriter) rebase(ctx context.Context, after client.Object, patch map[string]any, changes []conditionChange) error {
	r := w.reader
	if r == nil {
		r = w.client
	}
	if err := r.Get(ctx, client.ObjectKeyFromObject(after), after); err != nil {
		return err
	}
	conds := conditionsOf(after)
	applyConditions(conds, changes)
	patch["conditions"] = *conds
	return nil
}

// statusPatch is the JSON merge patch of the status from before to
// after; nil when nothing changed. Only the status is serialised, not the
// whole object: it is what a write sends, and the spec and metadata of a
// Sandbox are most of its bytes.
func statusPatch(before, after client.Object) (map[string]any, error) {
	fail := func(what string, err error) (map[string]any, error) {
		return nil, fmt.Errorf("%s the status patch of %T %s/%s: %w", what, after, after.GetNamespace(), after.GetName(), err)
	}
	old, err := json.Marshal(statusOf(before))
	if err != nil {
		return fail("computing", err)
	}
	cur, err := json.Marshal(statusOf(after))
	if err != nil {
		return fail("computing", err)
	}
	if bytes.Equal(old, cur) {
		return nil, nil
	}
	data, err := jsonpatch.CreateMergePatch(old, cur)
	if err != nil {
		return fail("computing", err)
	}
	var patch map[string]any
	if err := json.Unmarshal(data, &patch); err != nil {
		return fail("reading", err)
	}
	if len(patch) == 0 {
		return nil, nil
	}
	return patch, nil
}

// statusOf is the status of a kind whose status this package writes.
func statusOf(obj client.Object) any {
	switch o := obj.(type) {
	case *v1alpha1.Sandbox:
		return &o.Status
	case *v1alpha1.SessionClaim:
		return &o.Status
	}
	panic(fmt.Sprintf("no status writer for %T", obj))
}

// conditionsOf is the conditions list of a kind whose status this package
// writes.
func conditionsOf(obj client.Object) *[]metav1.Condition {
	switch o := obj.(type) {
	case *v1alpha1.Sandbox:
		return &o.Status.Conditions
	case *v1alpha1.SessionClaim:
		return &o.Status.Conditions
	}
	panic(fmt.Sprintf("no status writer for %T", obj))
}

// conditionDiff is what turns the list before into the list after, by
// type: the conditions set or changed, and the types removed.
func conditionDiff(before, after *[]metav1.Condition) []conditionChange {
	var changes []conditionChange
	for _, c := range *after {
		if old := meta.FindStatusCondition(*before, c.Type); old == nil || *old != c {
			changes = append(changes, conditionChange{condition: c})
		}
	}
	for _, c := range *before {
		if meta.FindStatusCondition(*after, c.Type) == nil {
			changes = append(changes, conditionChange{condition: metav1.Condition{Type: c.Type}, remove: true})
		}
	}
	return changes
}

// conflictRetry is how soon a write that lost to another is tried again;
// the watch bringing the newer object usually comes first.
const conflictRetry = 50 * time.Millisecond

// requeueOnConflict turns a write that lost to another (the cache was a
// step behind) into a prompt retry rather than a logged error.
func requeueOnConflict(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	return ctrl.Result{}, err
}

// conditionTrue reports whether the condition of that type is True.
func conditionTrue(conds []metav1.Condition, typ string) bool {
	return meta.IsStatusConditionTrue(conds, typ)
}

// findCondition returns the condition of that type, or nil.
func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	return meta.FindStatusCondition(conds, typ)
}
