package v1alpha1

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
)

// The scheduling fields of a Sandbox are its Pod's (controllers/placement.go).
// They have the shape and the JSON of Kubernetes' own, so that a manifest
// written for a Pod's fields fits, but their own Go types: every enum and
// integer carries the bounds the API server admits by, as for every other
// field of this API (a value the API server stored and Go could not decode
// once made the whole Sandbox list unreadable). The API server checks the
// rest when it admits the Pod: a Sandbox it refuses is PodRefused with its
// words.

// Toleration is a Pod's toleration of a node's taint.
type Toleration struct {
	// Key is the taint's key; empty with operator Exists matches every taint.
	// +kubebuilder:validation:MaxLength=316
	// +optional
	Key string `json:"key,omitempty"`
	// Operator is Equal (the default: key and value match) or Exists.
	// +kubebuilder:validation:Enum=Exists;Equal
	// +optional
	Operator TolerationOperator `json:"operator,omitempty"`
	// Value is the taint's value, with operator Equal.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Value string `json:"value,omitempty"`
	// Effect is the taint's effect it matches; empty matches all.
	// +kubebuilder:validation:Enum=NoSchedule;PreferNoSchedule;NoExecute
	// +optional
	Effect TaintEffect `json:"effect,omitempty"`
	// TolerationSeconds is how long a NoExecute taint is tolerated before
	// eviction; unset: for ever.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=31536000
	// +optional
	TolerationSeconds *int64 `json:"tolerationSeconds,omitempty"`
}

// TolerationOperator is Exists or Equal.
type TolerationOperator string

// TaintEffect is NoSchedule, PreferNoSchedule or NoExecute.
type TaintEffect string

// LabelSelector selects by labels, as Kubernetes' own.
type LabelSelector struct {
	// MatchLabels must all match.
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	// MatchExpressions must all match.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelectorRequirement is one expression of a LabelSelector.
type LabelSelectorRequirement struct {
	// +kubebuilder:validation:MaxLength=316
	Key string `json:"key"`
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator LabelSelectorOperator `json:"operator"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Values []string `json:"values,omitempty"`
}

// LabelSelectorOperator is In, NotIn, Exists or DoesNotExist.
type LabelSelectorOperator string

// Affinity is a Pod's node affinity and affinity or anti-affinity to
// other Pods.
type Affinity struct {
	// +optional
	NodeAffinity *NodeAffinity `json:"nodeAffinity,omitempty"`
	// +optional
	PodAffinity *PodAffinity `json:"podAffinity,omitempty"`
	// +optional
	PodAntiAffinity *PodAffinity `json:"podAntiAffinity,omitempty"`
}

// NodeAffinity says which nodes the Pod may go to, or prefers.
type NodeAffinity struct {
	// +optional
	RequiredDuringSchedulingIgnoredDuringExecution *NodeSelector `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	PreferredDuringSchedulingIgnoredDuringExecution []PreferredSchedulingTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

// NodeSelector is a list of terms, one of which must match.
type NodeSelector struct {
	// +kubebuilder:validation:MaxItems=16
	NodeSelectorTerms []NodeSelectorTerm `json:"nodeSelectorTerms"`
}

// NodeSelectorTerm matches a node by its labels or fields.
type NodeSelectorTerm struct {
	// +kubebuilder:validation:MaxItems=16
	// +optional
	MatchExpressions []NodeSelectorRequirement `json:"matchExpressions,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	MatchFields []NodeSelectorRequirement `json:"matchFields,omitempty"`
}

// NodeSelectorRequirement is one expression of a NodeSelectorTerm.
type NodeSelectorRequirement struct {
	// +kubebuilder:validation:MaxLength=316
	Key string `json:"key"`
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist;Gt;Lt
	Operator NodeSelectorOperator `json:"operator"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Values []string `json:"values,omitempty"`
}

// NodeSelectorOperator is In, NotIn, Exists, DoesNotExist, Gt or Lt.
type NodeSelectorOperator string

// PreferredSchedulingTerm is a node term with a weight.
type PreferredSchedulingTerm struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Weight     int32            `json:"weight"`
	Preference NodeSelectorTerm `json:"preference"`
}

// PodAffinity is affinity (or anti-affinity) to other Pods.
type PodAffinity struct {
	// +kubebuilder:validation:MaxItems=16
	// +optional
	RequiredDuringSchedulingIgnoredDuringExecution []PodAffinityTerm `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	PreferredDuringSchedulingIgnoredDuringExecution []WeightedPodAffinityTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

// PodAffinityTerm selects Pods in namespaces, within a topology domain.
type PodAffinityTerm struct {
	// +optional
	LabelSelector *LabelSelector `json:"labelSelector,omitempty"`
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// +kubebuilder:validation:MaxLength=316
	TopologyKey string `json:"topologyKey"`
	// +optional
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	MatchLabelKeys []string `json:"matchLabelKeys,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	MismatchLabelKeys []string `json:"mismatchLabelKeys,omitempty"`
}

// WeightedPodAffinityTerm is a Pod affinity term with a weight.
type WeightedPodAffinityTerm struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Weight          int32           `json:"weight"`
	PodAffinityTerm PodAffinityTerm `json:"podAffinityTerm"`
}

// TopologySpreadConstraint spreads matching Pods over a topology.
type TopologySpreadConstraint struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	MaxSkew int32 `json:"maxSkew"`
	// +kubebuilder:validation:MaxLength=316
	TopologyKey string `json:"topologyKey"`
	// +kubebuilder:validation:Enum=DoNotSchedule;ScheduleAnyway
	WhenUnsatisfiable UnsatisfiableConstraintAction `json:"whenUnsatisfiable"`
	// +optional
	LabelSelector *LabelSelector `json:"labelSelector,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	MinDomains *int32 `json:"minDomains,omitempty"`
	// +kubebuilder:validation:Enum=Honor;Ignore
	// +optional
	NodeAffinityPolicy *NodeInclusionPolicy `json:"nodeAffinityPolicy,omitempty"`
	// +kubebuilder:validation:Enum=Honor;Ignore
	// +optional
	NodeTaintsPolicy *NodeInclusionPolicy `json:"nodeTaintsPolicy,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	MatchLabelKeys []string `json:"matchLabelKeys,omitempty"`
}

// UnsatisfiableConstraintAction is DoNotSchedule or ScheduleAnyway.
type UnsatisfiableConstraintAction string

// NodeInclusionPolicy is Honor or Ignore.
type NodeInclusionPolicy string

// sameJSON moves a value into Kubernetes' type of the same JSON.
func sameJSON[T any](in any) T {
	var out T
	b, err := json.Marshal(in)
	if err == nil {
		// Same names, and Kubernetes' types take more than ours.
		_ = json.Unmarshal(b, &out)
	}
	return out
}

// PodAffinity is the Sandbox's affinity as Kubernetes' (nil when none).
func (s *SandboxSpec) PodAffinity() *corev1.Affinity {
	if s.Affinity == nil {
		return nil
	}
	a := sameJSON[corev1.Affinity](s.Affinity)
	return &a
}

// PodTolerations are the Sandbox's tolerations as Kubernetes'.
func (s *SandboxSpec) PodTolerations() []corev1.Toleration {
	if len(s.Tolerations) == 0 {
		return nil
	}
	return sameJSON[[]corev1.Toleration](s.Tolerations)
}

// PodTopologySpreadConstraints are the Sandbox's as Kubernetes'.
func (s *SandboxSpec) PodTopologySpreadConstraints() []corev1.TopologySpreadConstraint {
	if len(s.TopologySpreadConstraints) == 0 {
		return nil
	}
	return sameJSON[[]corev1.TopologySpreadConstraint](s.TopologySpreadConstraints)
}
