package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// A new claim on a Sandbox not reported yet waits unreportedGrace for the
// Sandbox's first pass, then says Bound and not Ready, and Ready once the
// Sandbox reports: two writes. With 10,000 Sandboxes created at once the
// Sandbox controller's queue is longer than the grace, and the claims
// wrote 1.8 times each, on the API server that was already the limit.
// A Sandbox still waiting in this process's own queue for its first pass
// will be reported by this process: its claims wait on (checked again
// every unreportedGrace, up to queuedGrace) instead of saying so. Once
// the first pass is over, whatever it found, the grace applies as before.

// queuedGrace bounds how long a new claim waits on a Sandbox queued for
// its first pass.
const queuedGrace = 10 * time.Minute

// queuedSandboxes are the Sandboxes this process has seen created and
// not yet passed once. A nil set holds none.
type queuedSandboxes struct {
	mu   sync.Mutex
	keys map[types.NamespacedName]struct{}
}

func newQueuedSandboxes() *queuedSandboxes {
	return &queuedSandboxes{keys: map[types.NamespacedName]struct{}{}}
}

// created records each Sandbox the watch says was created (the start's
// list included) and lets every event through.
func (q *queuedSandboxes) created() predicate.Funcs {
	return predicate.Funcs{CreateFunc: func(e event.CreateEvent) bool {
		q.mu.Lock()
		q.keys[client.ObjectKeyFromObject(e.Object)] = struct{}{}
		q.mu.Unlock()
		return true
	}}
}

// passed forgets key: its pass is over.
func (q *queuedSandboxes) passed(key types.NamespacedName) {
	if q == nil {
		return
	}
	q.mu.Lock()
	delete(q.keys, key)
	q.mu.Unlock()
}

// queued says whether key waits for its first pass.
func (q *queuedSandboxes) queued(key types.NamespacedName) bool {
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.keys[key]
	return ok
}
