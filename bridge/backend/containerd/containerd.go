// Package containerd is the containerd backend as the registry knows it:
// one container per agent (runtimes/containerd), configured by
// spec.containerd, whose image a SandboxClass may restrict.
package containerd

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Backend describes the containerd backend to the registry.
func Backend() backend.Backend {
	return backend.Backend{
		Name:     v1alpha1.BackendContainerd,
		Validate: validate,
		Describe: describe,
		Class:    class,
	}
}

// validate requires spec.containerd with an image: without one there is
// nothing to run.
func validate(spec *v1alpha1.SandboxSpec) field.ErrorList {
	if spec.Containerd == nil || spec.Containerd.Image == "" {
		return field.ErrorList{field.Required(field.NewPath("spec", "containerd"), v1alpha1.MsgContainerdRequired)}
	}
	return nil
}

// describe gives the instance the image and the containerd config. The
// config keeps the deprecated limits as written: the ConfigHash of every
// running containerd instance is computed with them.
func describe(spec *v1alpha1.SandboxSpec, in *runtimes.Instance) {
	c := spec.Containerd
	in.Image = c.Image
	in.Containerd = &runtimes.ContainerdConfig{
		MemoryLimit:     backend.Size(c.MemoryLimit),
		RootfsSizeLimit: backend.Size(c.RootfsSizeLimit),
	}
	if c.PidsLimit != nil {
		in.Containerd.PidsLimit = *c.PidsLimit
	}
}

// class holds the image to the class's allowedImages.containerd and the
// root file system's size to its limits.
func class(cl *v1alpha1.SandboxClass, spec, out *v1alpha1.SandboxSpec) []string {
	c := spec.Containerd
	if c == nil {
		return nil
	}
	cs := &cl.Spec
	var v []string
	if !backend.ImageAllowed(c.Image, cs.AllowedImages.Containerd, true) {
		v = append(v, fmt.Sprintf("spec.containerd.image: SandboxClass %q does not allow the image %q (allowed: [%s])", cl.Name, c.Image, strings.Join(cs.AllowedImages.Containerd, ", ")))
	}
	return append(v, backend.ClassLimit(cl.Name, "spec.containerd.rootfsSizeLimit", &out.Containerd.RootfsSizeLimit, cs.DefaultLimits, cs.MaxLimits,
		func(l *v1alpha1.ClassLimits) *resource.Quantity { return l.RootfsSizeLimit })...)
}
