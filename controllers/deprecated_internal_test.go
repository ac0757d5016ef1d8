package controllers

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// A Sandbox still setting the containerd-only limits hears it once per
// change, naming the replacement.
func TestDeprecatedLimitsAreNamedOncePerGeneration(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	r := &SandboxReconciler{Recorder: rec}
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "old", UID: "u1", Generation: 1},
		Spec: v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd,
			Containerd: &v1alpha1.ContainerdSpec{Image: "x", MemoryLimit: ptr.To(resource.MustParse("1Gi")), PidsLimit: ptr.To[int64](64)}}}
	r.warnDeprecated(sb)
	r.warnDeprecated(sb)
	sb.Generation = 2
	r.warnDeprecated(sb)
	r.warnDeprecated(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "new", UID: "u2", Generation: 1}})
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 2 {
		t.Fatalf("events %q, want one for each of the two generations", got)
	}
	for _, e := range got {
		if !strings.Contains(e, EventDeprecatedField) || !strings.Contains(e, "use spec.resources.limits.memory") || !strings.Contains(e, "use spec.resources.pidsLimit") {
			t.Fatalf("event %q does not name the fields and their replacements", e)
		}
	}
}

// An instance's start and stop are Normal events only when asked for:
// each is an API write, and the Ready condition says the same.
func TestRoutineEventsOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		rec := record.NewFakeRecorder(10)
		r := &SandboxReconciler{Recorder: rec, Options: Options{RoutineEvents: on}}
		r.routineEvent(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "s"}}, v1alpha1.ReasonRunning, "started instance %s", "i")
		close(rec.Events)
		var got []string
		for e := range rec.Events {
			got = append(got, e)
		}
		if want := map[bool]int{false: 0, true: 1}[on]; len(got) != want {
			t.Errorf("RoutineEvents %v: events %q, want %d", on, got, want)
		}
		if on && len(got) == 1 && got[0] != "Normal "+v1alpha1.ReasonRunning+" started instance i" {
			t.Errorf("RoutineEvents: event %q", got[0])
		}
	}
}
