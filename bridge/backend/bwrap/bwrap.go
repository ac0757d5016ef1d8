// Package bwrap is the bwrap backend as the registry knows it: a fresh
// bubblewrap namespace per command (runtimes/bwrap). Its one setting,
// spec.bwrap.image (on a cluster: an image whose file system its commands
// see as their system directories), is held to a SandboxClass's
// allowedImages.bwrap.
package bwrap

import (
	"fmt"
	"strings"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Backend describes the bwrap backend to the registry.
func Backend() backend.Backend {
	return backend.Backend{Name: v1alpha1.BackendBwrap, Describe: describe, Class: class}
}

// describe gives the instance the image its commands see, if any. The
// Pod's container that holds it is the caller's to add (ImageContainer):
// only a node's controller knows it.
func describe(spec *v1alpha1.SandboxSpec, in *runtimes.Instance) {
	if b := spec.Bwrap; b != nil {
		in.Image = b.Image
	}
}

// class holds the image to the class's allowedImages.bwrap; a Sandbox
// without one needs no entry.
func class(cl *v1alpha1.SandboxClass, spec, _ *v1alpha1.SandboxSpec) []string {
	b := spec.Bwrap
	if b == nil || b.Image == "" {
		return nil
	}
	allowed := cl.Spec.AllowedImages.Bwrap
	if backend.ImageAllowed(b.Image, allowed, true) {
		return nil
	}
	return []string{fmt.Sprintf("spec.bwrap.image: SandboxClass %q does not allow the image %q (allowed: [%s])", cl.Name, b.Image, strings.Join(allowed, ", "))}
}
