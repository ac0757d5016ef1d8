package execapi

import "sync"

// claimLimiter counts the commands running for each claim.
type claimLimiter struct {
	max     int
	mu      sync.Mutex
	running map[string]int
}

func newClaimLimiter(max int) *claimLimiter {
	return &claimLimiter{max: max, running: map[string]int{}}
}

// acquire takes a slot for the claim; false means the claim is at its limit.
func (l *claimLimiter) acquire(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running[key] >= l.max {
		return false
	}
	l.running[key]++
	return true
}

func (l *claimLimiter) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running[key]--; l.running[key] <= 0 {
		delete(l.running, key)
	}
}

// refusalTooManyUploads is the refusal reason of an upload over MaxUploads.
const refusalTooManyUploads = "TooManyUploads"

// uploadSlots bounds the uploads in progress on the server. A request that
// finds none free is refused at once rather than queued: a queue would hold
// its connection and body open anyway.
type uploadSlots chan struct{}

func newUploadSlots(n int) uploadSlots { return make(uploadSlots, n) }

// tryAcquire takes a slot; false means every slot is taken.
func (s uploadSlots) tryAcquire() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s uploadSlots) release() { <-s }
