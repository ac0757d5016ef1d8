package controllers

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// runtimeProbeInterval is how often a runtime that Sandboxes report
// unavailable is asked whether it is back.
const runtimeProbeInterval = time.Second

// runtimeProbe re-queues the Sandboxes that report RuntimeUnavailable as
// soon as their runtime answers again, rather than when their back-off
// ends: while any Sandbox of a backend says RuntimeUnavailable, it calls
// that driver's List (cheap: it answers only when the daemon does) every
// runtimeProbeInterval, and on an answer sends each such Sandbox once to
// the Sandbox controller.
type runtimeProbe struct {
	reader   client.Reader
	runtimes map[v1alpha1.Backend]runtimes.Runtime
	node     string
	interval time.Duration
	out      chan<- event.GenericEvent
	// sent are the Sandboxes sent since their runtime last failed a probe:
	// one that is still unavailable after its reconcile is left to the
	// back-off instead of being sent every interval.
	sent map[client.ObjectKey]bool
}

func (p *runtimeProbe) NeedLeaderElection() bool { return false }

func (p *runtimeProbe) Start(ctx context.Context) error {
	p.sent = map[client.ObjectKey]bool{}
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		p.probe(ctx)
	}
}

// runtimeWaiting indexes a Sandbox that waits for its runtime (reports
// RuntimeUnavailable, is not being deleted) under its backend. The probe
// asks the index every interval: a list of every Sandbox each time copied
// them all (at 10,000 Sandboxes some 20 MB a second to collect, for the
// few, usually none, that wait).
func runtimeWaiting(o client.Object) []string {
	sb := o.(*v1alpha1.Sandbox)
	if sb.DeletionTimestamp.IsZero() && runtimeUnavailable(sb.Status.Conditions) {
		return []string{string(sb.Spec.BackendOrDefault())}
	}
	return nil
}

func (p *runtimeProbe) probe(ctx context.Context) {
	waiting := map[v1alpha1.Backend][]*v1alpha1.Sandbox{}
	waitingKeys := map[client.ObjectKey]bool{}
	for backend := range p.runtimes {
		var list v1alpha1.SandboxList
		if err := p.reader.List(ctx, &list, client.MatchingFields{indexSandboxWaitingRuntime: string(backend)}); err != nil {
			return
		}
		for i := range list.Items {
			sb := &list.Items[i]
			if onNode(sb, p.node) {
				waiting[backend] = append(waiting[backend], sb)
				waitingKeys[client.ObjectKeyFromObject(sb)] = true
			}
		}
	}
	for backend, sbs := range waiting {
		rt, ok := p.runtimes[backend]
		if !ok {
			continue
		}
		if !p.answers(ctx, rt) {
			for _, sb := range sbs {
				delete(p.sent, client.ObjectKeyFromObject(sb))
			}
			continue
		}
		for _, sb := range sbs {
			key := client.ObjectKeyFromObject(sb)
			if p.sent[key] {
				continue
			}
			select {
			case p.out <- event.GenericEvent{Object: sb}:
				p.sent[key] = true
				log.FromContext(ctx).V(1).Info("runtime answers again; re-queued Sandbox", "backend", backend, "sandbox", key.String())
			case <-ctx.Done():
				return
			}
		}
	}
	// Forget Sandboxes that no longer wait, so a later outage sends them again.
	for key := range p.sent {
		if !waitingKeys[key] {
			delete(p.sent, key)
		}
	}
}

// answers calls the driver's List with a deadline of one interval.
func (p *runtimeProbe) answers(ctx context.Context, rt runtimes.Runtime) bool {
	ctx, cancel := context.WithTimeout(ctx, p.interval)
	defer cancel()
	_, err := rt.List(ctx)
	return err == nil
}

func runtimeUnavailable(conds []metav1.Condition) bool {
	c := meta.FindStatusCondition(conds, v1alpha1.ConditionRuntimeReady)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonRuntimeUnavailable
}
