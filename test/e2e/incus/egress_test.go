//go:build e2e

package incus_test

import (
	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

var _ = egresstest.Suite{
	Backend:      v1alpha1.BackendIncus,
	Env:          func() *testharness.Env { return env },
	World:        func() *egresstest.World { return world },
	Networks:     func() *egress.Networks { return networks },
	Runtime:      func() runtimes.Runtime { return driver },
	Spec:         func(s *v1alpha1.SandboxSpec) { s.Incus = &v1alpha1.IncusSpec{Image: image} },
	Probe:        egresstest.StaticProbe,
	Commands:     []v1alpha1.BinaryName{egresstest.ProbeCommand},
	OwnNamespace: true,
}.Register()
