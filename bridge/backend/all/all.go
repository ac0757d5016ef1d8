// Package all registers the backends this module ships. bridge/instance
// imports it, so every path that validates or describes a sandbox (the
// controller, sandboxctl, the sandbox.toml loader and all their tests)
// knows them without naming one.
package all

import (
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/bridge/backend/bwrap"
	"github.com/cireilclaw/sandbox-controller/bridge/backend/containerd"
	"github.com/cireilclaw/sandbox-controller/bridge/backend/incus"
)

func init() {
	// One line per backend: this list is where a new backend adds its own.
	backend.Register(bwrap.Backend())
	backend.Register(containerd.Backend())
	backend.Register(incus.Backend())
}
