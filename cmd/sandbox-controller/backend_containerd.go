//go:build !sandbox_no_containerd

package main

import (
	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
)

// The containerd driver; the tag sandbox_no_containerd leaves it, and
// containerd's client, out of the build.
func init() { backend.RegisterDriver(v1alpha1.BackendContainerd, containerd.Flags) }
