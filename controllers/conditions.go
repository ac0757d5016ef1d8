package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// statusPatch is an object as the reconcile read it. write sends the
// API server a merge patch of what the reconcile changed in the object's
// status since, and nothing at all when nothing changed, so steady-state
// reconciles write nothing. An object deleted meanwhile is not an error.
type statusPatch struct {
	before client.Object
}

// snapshot remembers obj as it is now.
func snapshot(obj client.Object) statusPatch {
	return statusPatch{before: obj.DeepCopyObject().(client.Object)}
}

func (p statusPatch) write(ctx context.Context, c client.Client, obj client.Object) error {
	data, err := client.MergeFrom(p.before).Data(obj)
	if err != nil {
		return fmt.Errorf("computing the status patch of %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	if string(data) == "{}" {
		return nil
	}
	if err := c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, data)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing status of %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
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
