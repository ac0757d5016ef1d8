package controllers

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// apiServer starts a real API server with the CRDs for one test.
func apiServer(t *testing.T) client.Client {
	t.Helper()
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(t, "kube-apiserver and etcd", p)
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{testenv.CRDDir(1)}, ErrorIfCRDPathMissing: true}
	cfg, err := localcp.StartEnvironment(env)
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setCondition(obj client.Object, typ, reason string) {
	applyConditions(conditionsOf(obj), []conditionChange{{condition: metav1.Condition{
		Type: typ, Status: metav1.ConditionFalse, Reason: reason, Message: reason}}})
}

func reasonOf(t *testing.T, c client.Client, sb *v1alpha1.Sandbox, typ string) string {
	t.Helper()
	got := &v1alpha1.Sandbox{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(sb), got); err != nil {
		t.Fatal(err)
	}
	if cond := findCondition(got.Status.Conditions, typ); cond != nil {
		return cond.Reason
	}
	return ""
}

// Two writers of one status: a pass that read the Sandbox before the
// other wrote keeps the other's conditions, sets its own, removes what it
// removed, and a write only over the object as read loses instead.
func TestWriteStatusMergesConditionsByType(t *testing.T) {
	ctx := context.Background()
	c := apiServer(t)
	w := statusWriter{client: c, shared: true}
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "two-writers", Namespace: "default"}, Spec: v1alpha1.SandboxSpec{Agent: "two-writers"}}
	if err := c.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	read := sb.DeepCopy()
	setCondition(sb, v1alpha1.ConditionOverlayHealthy, "First")
	if err := w.writeStatus(ctx, read, sb, mergeConditions); err != nil {
		t.Fatal(err)
	}

	// The first writer reads, then the second writes Ready.
	first := sb.DeepCopy()
	second, secondRead := sb.DeepCopy(), sb.DeepCopy()
	setCondition(second, v1alpha1.ConditionReady, v1alpha1.ReasonPlaced)
	if err := w.writeStatus(ctx, secondRead, second, unlessChanged); err != nil {
		t.Fatal(err)
	}

	// The first, from what it read, sets RuntimeReady and removes
	// OverlayHealthy.
	firstRead := first.DeepCopy()
	setCondition(first, v1alpha1.ConditionRuntimeReady, v1alpha1.ReasonStopped)
	first.Status.Conditions = removeType(first.Status.Conditions, v1alpha1.ConditionOverlayHealthy)
	if err := w.writeStatus(ctx, firstRead, first, mergeConditions); err != nil {
		t.Fatal(err)
	}
	if got := reasonOf(t, c, sb, v1alpha1.ConditionReady); got != v1alpha1.ReasonPlaced {
		t.Errorf("Ready the other writer set: reason %q after a stale write, want %q", got, v1alpha1.ReasonPlaced)
	}
	if got := reasonOf(t, c, sb, v1alpha1.ConditionRuntimeReady); got != v1alpha1.ReasonStopped {
		t.Errorf("RuntimeReady: reason %q, want %q", got, v1alpha1.ReasonStopped)
	}
	if got := reasonOf(t, c, sb, v1alpha1.ConditionOverlayHealthy); got != "" {
		t.Errorf("OverlayHealthy was removed, but the stored status has reason %q", got)
	}
	if findCondition(first.Status.Conditions, v1alpha1.ConditionReady) == nil {
		t.Error("after the write the object does not hold the stored status")
	}

	// A write only over the object as read loses to the one before.
	setCondition(secondRead, v1alpha1.ConditionReady, v1alpha1.ReasonUnschedulable)
	stale := secondRead.DeepCopy()
	stale.Status.Conditions = nil
	err := w.writeStatus(ctx, stale, secondRead, unlessChanged)
	if !apierrors.IsConflict(err) {
		t.Fatalf("a write over a changed object: %v, want a conflict", err)
	}
	if got := reasonOf(t, c, sb, v1alpha1.ConditionReady); got != v1alpha1.ReasonPlaced {
		t.Errorf("Ready after a write that lost: reason %q, want %q", got, v1alpha1.ReasonPlaced)
	}

	// Nothing changed, nothing written.
	rv := first.ResourceVersion
	if err := w.writeStatus(ctx, first.DeepCopy(), first, mergeConditions); err != nil || first.ResourceVersion != rv {
		t.Errorf("a write of an unchanged status: %v, resourceVersion %s -> %s", err, rv, first.ResourceVersion)
	}
}

func removeType(conds []metav1.Condition, typ string) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range conds {
		if c.Type != typ {
			out = append(out, c)
		}
	}
	return out
}
