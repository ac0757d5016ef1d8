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
// unavailable is asked whether it is back, and a daemon whether it is
// still there.
const runtimeProbeInterval = time.Second

// runtimeProbe re-queues the Sandboxes that report RuntimeUnavailable as
// soon as their runtime answers again, rather than when their back-off
// ends: while any Sandbox of a backend says RuntimeUnavailable, it asks
// that driver (Ping for a daemon's, else List: each answers only when the
// runtime does) every runtimeProbeInterval, and on an answer sends each
// such Sandbox once to the Sandbox controller.
//
// It also notices a daemon going away (watchDaemons), which no event
// would tell the Sandboxes whose instances outlive it.
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
	// up says, for each backend whose driver works through a daemon
	// (runtimes.Pinger), whether the daemon answered the last ping.
	up map[v1alpha1.Backend]bool
}

func (p *runtimeProbe) NeedLeaderElection() bool { return false }

func (p *runtimeProbe) Start(ctx context.Context) error {
	p.sent = map[client.ObjectKey]bool{}
	p.up = map[v1alpha1.Backend]bool{}
	// A daemon that answers now is one that can go before the first tick.
	p.watchDaemons(ctx)
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
	p.watchDaemons(ctx)
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

// watchDaemons pings, every interval, each driver that works through a
// daemon. A running instance outlives its daemon, and a Sandbox whose
// status no longer changes has no pass to find out: when a daemon that
// answered stops answering, every Sandbox of that backend on this node
// that does not say so yet is sent, and its pass reports
// RuntimeUnavailable (after which the probe waits for the daemon's return
// as for any other).
func (p *runtimeProbe) watchDaemons(ctx context.Context) {
	if p.up == nil {
		p.up = map[v1alpha1.Backend]bool{}
	}
	for backend, rt := range p.runtimes {
		pinger, ok := rt.(runtimes.Pinger)
		if !ok {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, p.interval)
		err := pinger.Ping(pctx)
		cancel()
		was := p.up[backend]
		p.up[backend] = err == nil
		if err == nil || !was {
			continue
		}
		log.FromContext(ctx).Info("runtime stopped answering; re-queueing its Sandboxes", "backend", backend, "error", err.Error())
		p.sendAll(ctx, backend)
	}
}

// sendAll sends every Sandbox of backend on this node that does not
// report RuntimeUnavailable yet. It reads every Sandbox, and runs only
// when a daemon goes away.
func (p *runtimeProbe) sendAll(ctx context.Context, backend v1alpha1.Backend) {
	var list v1alpha1.SandboxList
	// Only keys leave this function: the cache's objects are not copied.
	if err := p.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "listing Sandboxes whose runtime stopped answering", "backend", backend)
		return
	}
	for i := range list.Items {
		sb := &list.Items[i]
		if sb.Spec.BackendOrDefault() != backend || !onNode(sb, p.node) || runtimeUnavailable(sb.Status.Conditions) {
			continue
		}
		key := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sb.Namespace, Name: sb.Name}}
		select {
		case p.out <- event.GenericEvent{Object: key}:
		case <-ctx.Done():
			return
		}
	}
}

// answers pings a driver that works through a daemon, and calls any
// other's List, with a deadline of one interval.
func (p *runtimeProbe) answers(ctx context.Context, rt runtimes.Runtime) bool {
	ctx, cancel := context.WithTimeout(ctx, p.interval)
	defer cancel()
	if pinger, ok := rt.(runtimes.Pinger); ok {
		return pinger.Ping(ctx) == nil
	}
	_, err := rt.List(ctx)
	return err == nil
}

func runtimeUnavailable(conds []metav1.Condition) bool {
	c := meta.FindStatusCondition(conds, v1alpha1.ConditionRuntimeReady)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonRuntimeUnavailable
}
