package backend

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// ValidateSpec applies every admission rule to a spec that did not come
// through the API server (sandbox.toml), and again in the controller so
// that a CRD installed without its rules cannot widen a sandbox: the
// backend is a registered one, its own settings follow its rules, and the
// rest follows the rules every backend shares
// (v1alpha1.ValidateSandboxSpec). The messages are the API's.
func ValidateSpec(spec *v1alpha1.SandboxSpec) field.ErrorList {
	return append(validateBackend(spec), v1alpha1.ValidateSandboxSpec(spec)...)
}

// validateBackend checks that spec names a registered backend and applies
// that backend's rules.
func validateBackend(spec *v1alpha1.SandboxSpec) field.ErrorList {
	b, ok := Lookup(spec.BackendOrDefault())
	if !ok {
		return field.ErrorList{field.NotSupported(field.NewPath("spec", "backend"), spec.Backend, nameStrings())}
	}
	if b.Validate == nil {
		return nil
	}
	return b.Validate(spec)
}

func nameStrings() []string {
	names := Names()
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = string(n)
	}
	return out
}
