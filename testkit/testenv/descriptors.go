package testenv

import (
	"os"
	"path/filepath"
)

// OpenDescriptors counts this process's descriptors whose target (as
// /proc/self/fd names it) match says yes to.
func OpenDescriptors(t TB, match func(target string) bool) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("listing this process's descriptors: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && match(target) {
			n++
		}
	}
	return n
}
