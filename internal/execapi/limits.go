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
