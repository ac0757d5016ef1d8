//go:build !sandbox_no_incus

package main

import (
	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus"
)

// The incus driver; the tag sandbox_no_incus leaves it out of the build.
func init() { backend.RegisterDriver(v1alpha1.BackendIncus, incus.Flags) }
