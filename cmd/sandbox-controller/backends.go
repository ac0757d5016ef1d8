package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// driverList is the backends whose drivers this build links, as --backends
// and its errors name them.
func driverList(drivers map[v1alpha1.Backend]runtimes.Constructor) string {
	s := make([]string, 0, len(drivers))
	for n := range drivers {
		s = append(s, string(n))
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}

// The drivers this manager runs: one line per backend, whose flags and
// constructor live in its driver package. bwrap's is always linked; those
// of containerd and incus each sit in a file of their own that a build tag
// leaves out (backend_containerd.go, backend_incus.go), for a node that
// runs one backend and need not carry the others' clients. Describing and
// validating a spec go through the backends bridge/instance registers,
// which link no driver.
func init() {
	backend.RegisterDriver(v1alpha1.BackendBwrap, bwrap.Flags)
}

// bindBackendFlags binds every registered driver's flags on fs, enabled or
// not, and returns what builds each backend's driver once fs is parsed.
func bindBackendFlags(fs *flag.FlagSet) map[v1alpha1.Backend]runtimes.Constructor {
	built := map[v1alpha1.Backend]runtimes.Constructor{}
	for name, flags := range backend.Drivers() {
		built[name] = flags(fs)
	}
	return built
}

// enableBackends builds the driver of each backend --backends names. On an
// error the drivers built so far are closed again.
func enableBackends(ctx context.Context, f flags, stateDir string) (map[v1alpha1.Backend]runtimes.Runtime, func(), error) {
	rts := map[v1alpha1.Backend]runtimes.Runtime{}
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, b := range strings.Split(f.backends, ",") {
		name := v1alpha1.Backend(strings.TrimSpace(b))
		build, ok := f.drivers[name]
		if !ok {
			closeAll()
			if _, known := backend.Lookup(name); known {
				return nil, nil, fmt.Errorf("--backends: backend %q is not in this build: it was built with the tag sandbox_no_%s (available: %s)", name, name, driverList(f.drivers))
			}
			return nil, nil, fmt.Errorf("--backends: unknown backend %q (available: %s)", b, driverList(f.drivers))
		}
		rt, closeRT, err := build(ctx, stateDir)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("--backends %s: %w", name, err)
		}
		if closeRT != nil {
			closers = append(closers, closeRT)
		}
		rts[name] = rt
	}
	return rts, closeAll, nil
}

// logCgroupStarts says how each backend that chooses starts its commands
// inside their cgroups on cgroup v1 (bwrap.Runtime.CgroupV1Start), and
// what it measured to choose.
func logCgroupStarts(log logr.Logger, rts map[v1alpha1.Backend]runtimes.Runtime) {
	for name, rt := range rts {
		s, ok := rt.(interface {
			CgroupV1Start() (string, *cgroup.StartCosts)
		})
		if !ok {
			continue
		}
		how, costs := s.CgroupV1Start()
		if how == "" {
			continue
		}
		kv := []any{"backend", name, "start", how}
		if costs != nil {
			kv = append(kv, "measured", costs.String())
		}
		log.Info("commands start inside their cgroups (cgroup v1)", kv...)
	}
}
