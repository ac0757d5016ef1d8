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

// refusalTooManyDownloads is the refusal reason of a download or listing
// over MaxDownloads.
const refusalTooManyDownloads = "TooManyDownloads"

// uploadSlots bounds the uploads in progress on the server, and those of
// any one namespace to three quarters of them (the downloads have slots of
// their own, as long as their answer takes to leave): a slot is held for
// as long as its body takes to arrive, so one tenant sending its bodies a byte a
// minute would otherwise hold every slot and refuse every other tenant's
// uploads. A request that finds none free is refused at once rather than
// queued: a queue would hold its connection and body open anyway.
type uploadSlots struct {
	all   chan struct{}
	share int
	mu    sync.Mutex
	perNS map[string]int
}

func newUploadSlots(n int) *uploadSlots {
	return &uploadSlots{all: make(chan struct{}, n), share: uploadShare(n), perNS: map[string]int{}}
}

// uploadShare is the most uploads one namespace may have in progress out
// of n: all but a quarter, which stays for the other namespaces (and at
// least one).
func uploadShare(n int) int { return max(1, n-n/4) }

// tryAcquire takes a slot for an upload of namespace ns; byNS says the
// namespace's share, not the server's slots, was what was full.
func (s *uploadSlots) tryAcquire(ns string) (ok, byNS bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.all <- struct{}{}:
	default:
		return false, false
	}
	if s.perNS[ns] >= s.share {
		<-s.all
		return false, true
	}
	s.perNS[ns]++
	return true, false
}

func (s *uploadSlots) release(ns string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perNS[ns]--; s.perNS[ns] <= 0 {
		delete(s.perNS, ns)
	}
	<-s.all
}
