package bwrap

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// Where no cgroup can be made, an instance is refused, never silently
// unlimited; only the explicit switch lets it run, with a warning.
func TestNoCgroupRefusesUnlessAllowedLoudly(t *testing.T) {
	why := errors.Join(cgroup.ErrUnavailable, errors.New("read-only file system"))
	in := runtimes.Instance{Name: "cireilclaw-x", Resources: runtimes.Resources{Pids: 64}}

	strict := &Runtime{cgroupErr: why, warnings: &bytes.Buffer{}}
	err := strict.ensureCgroup(in)
	if runtimes.ReasonOf(err) != runtimes.ReasonLimitsUnavailable || !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("without cgroups: %v, want LimitsUnavailable saying why", err)
	}

	var warned bytes.Buffer
	loose := &Runtime{cgroupErr: why, warnings: &warned, allowUnlimited: true}
	if err := loose.ensureCgroup(in); err != nil {
		t.Fatalf("allowed unlimited: %v", err)
	}
	if !strings.Contains(warned.String(), "WITHOUT resource limits") || !strings.Contains(warned.String(), "read-only file system") {
		t.Fatalf("warning %q does not say the instance runs unlimited and why", warned.String())
	}
}
