package instance

import (
	"testing"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Every reason a driver can give must reach a condition as a reason the API
// documents, and no two driver reasons may read as one.
func TestEveryRuntimeReasonHasAConditionReason(t *testing.T) {
	seen := map[string]runtimes.Reason{}
	for _, r := range runtimes.Reasons() {
		s, ok := runtimeReasons[r]
		if !ok || s == "" {
			t.Errorf("runtimes.Reason %d has no condition reason in runtimeReasons", r)
			continue
		}
		if prev, dup := seen[s]; dup {
			t.Errorf("runtimes.Reason %d and %d both map to %q", prev, r, s)
		}
		seen[s] = r
	}
	if len(runtimeReasons) != len(runtimes.Reasons()) {
		t.Errorf("runtimeReasons has %d entries for %d runtimes reasons", len(runtimeReasons), len(runtimes.Reasons()))
	}
}
