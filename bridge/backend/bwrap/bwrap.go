// Package bwrap is the bwrap backend as the registry knows it: a fresh
// bubblewrap namespace per command (runtimes/bwrap), with no settings of
// its own in a spec, so nothing to validate, describe or hold to a class
// beyond what every backend shares.
package bwrap

import (
	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
)

// Backend describes the bwrap backend to the registry.
func Backend() backend.Backend {
	return backend.Backend{Name: v1alpha1.BackendBwrap}
}
