package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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
