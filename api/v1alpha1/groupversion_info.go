// Package v1alpha1 holds the Sandbox and SessionClaim API of the
// sandbox.cireilclaw.dev group: what an agent's environment is and which
// sessions need it now. Admission rules live here as CEL markers; the same
// rules, with the same messages, are exported as Go functions so that the
// sandbox.toml loader and the controller apply them identically.
//
// +kubebuilder:object:generate=true
// +groupName=sandbox.cireilclaw.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "sandbox.cireilclaw.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // kubebuilder's registration of the kinds; replacing it is a change of the API package's own

	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
