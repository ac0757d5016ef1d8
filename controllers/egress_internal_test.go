package controllers

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/record"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
)

// The proxies' decisions are counted under at most maxEgressHosts host
// labels per Sandbox, and a denied host is told in an Event at most once
// per egressDenialEvery.
func TestEgressWatchBoundsLabelsAndEvents(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := record.NewFakeRecorder(1000)
	w := &egressWatch{recorder: rec, now: func() time.Time { return now }, owners: map[string]*egressOwner{}}
	sb := &v1alpha1.Sandbox{}
	sb.Namespace, sb.Name, sb.UID = "team-a", "bounded", "uid-1"
	w.own("cireilclaw-bounded", sb)

	for i := range maxEgressHosts + 10 {
		w.decide("cireilclaw-bounded", egress.Decision{Host: fmt.Sprintf("h%d.example.com", i), Port: 443, Reason: "not listed"})
	}
	if got := testutil.ToFloat64(egressConnections.WithLabelValues("team-a", "bounded", "other", "denied")); got != 10 {
		t.Errorf("hosts past the bound counted as other: %v, want 10", got)
	}
	if got := testutil.ToFloat64(egressConnections.WithLabelValues("team-a", "bounded", "h0.example.com", "denied")); got != 1 {
		t.Errorf("h0.example.com denied: %v, want 1", got)
	}

	events := func() int {
		n := 0
		for {
			select {
			case <-rec.Events:
				n++
			default:
				return n
			}
		}
	}
	events()
	for range 5 {
		w.decide("cireilclaw-bounded", egress.Decision{Host: "h1.example.com", Port: 443, Reason: "not listed"})
	}
	if n := events(); n != 0 {
		t.Errorf("%d Events for a host denied again within a minute, want none", n)
	}
	now = now.Add(egressDenialEvery)
	w.decide("cireilclaw-bounded", egress.Decision{Host: "h1.example.com", Port: 443, Reason: "not listed"})
	w.decide("cireilclaw-bounded", egress.Decision{Host: "h1.example.com", Port: 443, Allowed: true})
	if n := events(); n != 1 {
		t.Errorf("%d Events a minute later, want 1", n)
	}
	if got := testutil.ToFloat64(egressConnections.WithLabelValues("team-a", "bounded", "h1.example.com", "allowed")); got != 1 {
		t.Errorf("h1.example.com allowed: %v, want 1", got)
	}

	w.forget("cireilclaw-bounded")
	if got := testutil.CollectAndCount(egressConnections); got != 0 {
		t.Errorf("%d series left of a forgotten Sandbox", got)
	}
	w.decide("cireilclaw-bounded", egress.Decision{Host: "late.example.com", Reason: "not listed"})
	if n := events(); n != 0 {
		t.Errorf("an Event for a forgotten Sandbox")
	}
}
