// Package incus is the Incus backend as the registry knows it: one system
// container per agent over incusd's API (runtimes/incus), configured by
// spec.incus, whose image a SandboxClass may restrict.
package incus

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Backend describes the Incus backend to the registry.
func Backend() backend.Backend {
	return backend.Backend{
		Name:     v1alpha1.BackendIncus,
		Validate: validate,
		Describe: describe,
		Class:    class,
	}
}

// validate requires spec.incus with an image: without one there is
// nothing to launch.
func validate(spec *v1alpha1.SandboxSpec) field.ErrorList {
	if spec.Incus == nil || spec.Incus.Image == "" {
		return field.ErrorList{field.Required(field.NewPath("spec", "incus"), v1alpha1.MsgIncusRequired)}
	}
	return nil
}

// describe gives the instance the image, the Incus config and whether the
// controller's shutdown stops it (shutdownOnExit, true unless set false).
func describe(spec *v1alpha1.SandboxSpec, in *runtimes.Instance) {
	c := spec.Incus
	in.Image = c.Image
	in.Incus = &runtimes.IncusConfig{
		Profiles:      slices.Clone(c.Profiles),
		Project:       c.Project,
		RootSizeLimit: backend.Size(c.RootSizeLimit),
	}
	if c.ShutdownOnExit != nil {
		v := *c.ShutdownOnExit
		in.Incus.ShutdownOnExit = &v
	}
	in.StopOnExit = c.ShutdownOnExit == nil || *c.ShutdownOnExit
}

// class holds the image to the class's allowedImages.incus, the profiles
// to its allowedIncusProfiles and the root disk's size to its limits.
func class(cl *v1alpha1.SandboxClass, spec, out *v1alpha1.SandboxSpec) []string {
	c := spec.Incus
	if c == nil {
		return nil
	}
	cs := &cl.Spec
	var v []string
	if !backend.ImageAllowed(c.Image, cs.AllowedImages.Incus, false) {
		v = append(v, fmt.Sprintf("spec.incus.image: SandboxClass %q does not allow the image %q (allowed: [%s])", cl.Name, c.Image, strings.Join(cs.AllowedImages.Incus, ", ")))
	}
	for i, p := range c.Profiles {
		if !slices.Contains(cs.AllowedIncusProfiles, "*") && !slices.Contains(cs.AllowedIncusProfiles, p) {
			v = append(v, fmt.Sprintf("spec.incus.profiles[%d]: SandboxClass %q does not allow the Incus profile %q (allowedIncusProfiles: [%s])", i, cl.Name, p, strings.Join(cs.AllowedIncusProfiles, ", ")))
		}
	}
	return append(v, backend.ClassLimit(cl.Name, "spec.incus.rootSizeLimit", &out.Incus.RootSizeLimit, cs.DefaultLimits, cs.MaxLimits,
		func(l *v1alpha1.ClassLimits) *resource.Quantity { return l.RootSizeLimit })...)
}
