package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// How a failed reconcile is retried. The work queue's default back-off
// doubles up to 1000s, so an object that failed through a 30s outage of
// the API server or a runtime daemon waited up to about a minute after the
// outage ended. A failure that passes when something comes back (the API
// server, a daemon) is retried at least every fastRetryCap; one the runtime
// will repeat until someone changes something (an image that is not there,
// a refused spec) at least every slowRetryCap, so it neither spins nor is
// forgotten.
const (
	retryBase    = 50 * time.Millisecond
	fastRetryCap = 2 * time.Second
	slowRetryCap = time.Minute
)

// retryLimiter is the controllers' per-object back-off: exponential from
// retryBase, capped by what the object's last failure was (note). It has
// no overall token bucket: the workers bound how much runs at once, and a
// bucket shared by every failing object would delay the first retry after
// an outage by the number of objects that failed during it.
type retryLimiter struct {
	mu       sync.Mutex
	failures map[reconcile.Request]int
	slow     map[reconcile.Request]bool
}

func newRetryLimiter() *retryLimiter {
	return &retryLimiter{failures: map[reconcile.Request]int{}, slow: map[reconcile.Request]bool{}}
}

func (l *retryLimiter) When(req reconcile.Request) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.failures[req]
	l.failures[req] = n + 1
	limit := fastRetryCap
	if l.slow[req] {
		limit = slowRetryCap
	}
	if n >= 16 {
		return limit
	}
	return min(retryBase<<n, limit)
}

func (l *retryLimiter) Forget(req reconcile.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.failures, req)
	delete(l.slow, req)
}

func (l *retryLimiter) NumRequeues(req reconcile.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failures[req]
}

// note records how req's reconcile failed, before the controller asks When.
func (l *retryLimiter) note(req reconcile.Request, err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if refusedByRuntime(err) {
		l.slow[req] = true
	} else {
		delete(l.slow, req)
	}
}

// refusedByRuntime says whether err is a runtime's answer that repeating
// the call will not change: every runtime error except RuntimeUnavailable.
// API server errors, deadlines and unreachable daemons pass when what
// failed comes back.
func refusedByRuntime(err error) bool {
	var re *runtimes.Error
	return errors.As(err, &re) && re.Reason != runtimes.ReasonUnavailable
}

// withRetries wraps a reconciler for its controller: expected races are
// retried without an error (and without the stack trace controller-runtime
// logs with every error), and every other failure is noted in the limiter
// so its retry comes as soon as it can pass.
func withRetries(l *retryLimiter, next reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
		res, err := next.Reconcile(ctx, req)
		switch {
		case err == nil:
		case apierrors.IsConflict(err):
			// A write lost to another one: the cache was a step behind and
			// the watch bringing the newer object is on its way.
			log.FromContext(ctx).V(1).Info("write conflict; retrying", "error", err.Error())
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		case apierrors.IsNotFound(err):
			// Something went while this reconcile used it (a claim deleted
			// while it was updated); the retry sees what is left.
			log.FromContext(ctx).V(1).Info("an object went during the reconcile; retrying", "error", err.Error())
			return ctrl.Result{RequeueAfter: time.Second}, nil
		default:
			l.note(req, err)
		}
		return res, err
	})
}

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

func (p *runtimeProbe) probe(ctx context.Context) {
	var list v1alpha1.SandboxList
	if err := p.reader.List(ctx, &list); err != nil {
		return
	}
	waiting := map[v1alpha1.Backend][]*v1alpha1.Sandbox{}
	waitingKeys := map[client.ObjectKey]bool{}
	for i := range list.Items {
		sb := &list.Items[i]
		if onNode(sb, p.node) && sb.DeletionTimestamp.IsZero() && runtimeUnavailable(sb.Status.Conditions) {
			waiting[sb.Spec.BackendOrDefault()] = append(waiting[sb.Spec.BackendOrDefault()], sb)
			waitingKeys[client.ObjectKeyFromObject(sb)] = true
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
