package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus"
)

// backendList is the registered backends as --backends and its errors name
// them.
func backendList() string {
	names := backend.Names()
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}

// The drivers this manager runs: one line per backend, whose flags and
// constructor live in its driver package. Describing and validating a spec
// go through the backends bridge/instance registers, which link no
// driver.
func init() {
	backend.RegisterDriver(v1alpha1.BackendBwrap, bwrap.Flags)
	backend.RegisterDriver(v1alpha1.BackendContainerd, containerd.Flags)
	backend.RegisterDriver(v1alpha1.BackendIncus, incus.Flags)
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
			return nil, nil, fmt.Errorf("--backends: unknown backend %q (available: %s)", b, backendList())
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
