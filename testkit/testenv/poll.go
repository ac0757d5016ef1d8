package testenv

import "time"

// PollInterval is how often Eventually looks.
const PollInterval = 10 * time.Millisecond

// Eventually polls cond until it holds, and fails the test naming what it
// waited for when timeout passes first. It is the one polling loop of the
// tests that do not use Gomega's.
func Eventually(t TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s, still not: %s", timeout, what)
		}
		time.Sleep(PollInterval)
	}
}
