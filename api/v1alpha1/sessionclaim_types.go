package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SessionClaimSpec says which Sandbox a session needs.
type SessionClaimSpec struct {
	// SandboxName is the Sandbox in the claim's namespace. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sandboxName is immutable: create a new SessionClaim for another Sandbox"
	SandboxName string `json:"sandboxName"`

	// Session is the agent platform's free-text identifier of the session.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Session string `json:"session,omitempty"`
}

// SessionClaimStatus is what the controller observed.
type SessionClaimStatus struct {
	// ObservedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Instance is the runtime instance the session's commands run in.
	// +optional
	Instance string `json:"instance,omitempty"`
	// Conditions: Bound (the claim holds its Sandbox) and Ready (the Sandbox
	// is ready to run the session's commands).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SessionClaim says that a session of an agent needs its Sandbox now. The
// Sandbox's instance runs while at least one claim exists.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=claim;sessclaim,categories=cireilclaw
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxName`
// +kubebuilder:printcolumn:name="Bound",type=string,JSONPath=`.status.conditions[?(@.type=="Bound")].status`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Session",type=string,JSONPath=`.spec.session`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SessionClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SessionClaimSpec   `json:"spec"`
	Status SessionClaimStatus `json:"status,omitempty"`
}

// SessionClaimList is a list of SessionClaims.
// +kubebuilder:object:root=true
type SessionClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SessionClaim `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SessionClaim{}, &SessionClaimList{})
}
