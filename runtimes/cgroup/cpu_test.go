//go:build linux

package cgroup

import (
	"path/filepath"
	"strings"
	"testing"
)

// cpuFile reads one of the instance's CPU files: v1's name, or v2's.
func cpuFile(t *testing.T, m *Manager, v1, v2 string) string {
	t.Helper()
	name := v1
	if m.V2 {
		name = v2
	}
	b, err := readFile(filepath.Join(m.Dir("cpu", "inst"), name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(b)
}

// A CPU request taken away gives the instance back the kernel's default
// weight, as a new cgroup has: a Sandbox whose spec drops its request (or
// the next one of its agent, in a cgroup a removal left) keeps no share
// of the CPU it no longer asks for.
func TestCPURequestRemovedRestoresTheDefaultWeight(t *testing.T) {
	m := newManager(t)
	def := cpuFile(t, m, "cpu.shares", "cpu.weight")
	if err := m.Ensure("inst", Limits{Pids: 64, CPURequestMillis: 4000}); err != nil {
		t.Fatal(err)
	}
	if got := cpuFile(t, m, "cpu.shares", "cpu.weight"); got == def {
		t.Fatalf("a request of 4 CPUs left the weight at the default %s", got)
	}
	if err := m.Ensure("inst", Limits{Pids: 64}); err != nil {
		t.Fatal(err)
	}
	if got := cpuFile(t, m, "cpu.shares", "cpu.weight"); got != def {
		t.Fatalf("the request taken away, the weight is %s; want the default %s", got, def)
	}
}

// A CPU limit beyond what the kernel's CFS quota can hold is no limit (no
// host has that many CPUs), never a quota wrapped to 1% of one or one the
// kernel refuses; the same for a request beyond the largest weight.
func TestHugeCPUAmountsAreNoLimit(t *testing.T) {
	m := newManager(t)
	for _, l := range []Limits{
		{Pids: 64, CPUMillis: 1 << 60, CPURequestMillis: 1 << 60},
		{Pids: 64, CPUMillis: 200_000_000_000, CPURequestMillis: 1 << 62},
	} {
		if err := m.Ensure("inst", l); err != nil {
			t.Fatalf("limits %+v: %v", l, err)
		}
		quota := cpuFile(t, m, "cpu.cfs_quota_us", "cpu.max")
		if quota != "-1" && !strings.HasPrefix(quota, "max ") {
			t.Errorf("limits %+v: the CFS quota is %s; want none", l, quota)
		}
		if w := cpuFile(t, m, "cpu.shares", "cpu.weight"); w != "262144" && w != "10000" {
			t.Errorf("limits %+v: the weight is %s; want the largest", l, w)
		}
	}
}
