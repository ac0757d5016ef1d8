package bwrap

import "time"

// SetStaleClock sets the clock of the stale-tree check for a test; the
// function it returns puts the real one back.
func SetStaleClock(clock func() time.Time) (restore func()) {
	old := now
	now = clock
	return func() { now = old }
}
