package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultClassLabel marks the SandboxClass that applies to Sandboxes
// without spec.className, with the value "true". It is a label rather than
// StorageClass's annotation because the admission policy selects classes by
// label (paramRef.selector).
const DefaultClassLabel = "sandboxclass.sandbox.cireilclaw.dev/is-default-class"

// The messages of the SandboxClass's own schema rules.
const (
	MsgClassRoot      = "allowedMountSourceRoots are absolute directories without '.', '..', empty segments or a trailing '/' ('/' alone allows every directory)"
	MsgClassEnv       = "allowedEnv entries are variable names, or a name prefix followed by '*' ('*' alone allows every variable)"
	MsgClassAgentIDs  = "agentIDs is FIRST:COUNT, two decimal numbers"
	MsgClassMemoryMax = "defaultLimits.memoryLimit must not be above maxLimits.memoryLimit"
	MsgClassPidsMax   = "defaultLimits.pidsLimit must not be above maxLimits.pidsLimit"
	MsgClassRootfsMax = "defaultLimits.rootfsSizeLimit must not be above maxLimits.rootfsSizeLimit"
	MsgClassRootMax   = "defaultLimits.rootSizeLimit must not be above maxLimits.rootSizeLimit"
	MsgClassEgress    = "allowedEgress entries are hosts as in a Sandbox's network.allow, or '*' for any host"
	MsgClassEgressNet = "allowedEgressNetworks entries are address ranges in CIDR notation, such as 10.0.0.0/8"
)

// ClassDevices says which device options of a Sandbox a class allows.
type ClassDevices struct {
	// USB allows spec.devices.usb.
	// +optional
	USB bool `json:"usb,omitempty"`
	// All allows spec.devices.all, the host /dev: a Sandbox with it can
	// reach every device of the node.
	// +optional
	All bool `json:"all,omitempty"`
}

// ClassImages lists the images a class allows per backend. An entry is an
// exact image reference, or ends in '*' and then allows every reference
// beginning with what comes before it ("registry.example.com/team-a/*";
// "*" alone allows any image). Of bwrap and containerd images, a '*'
// after a tag's ':' stands for a tag (and a digest after it) only:
// "ubuntu:*" allows "ubuntu:24.04", not "ubuntu:5000/x", a registry's
// host and port. An empty list allows no image, so the backend cannot be
// used.
type ClassImages struct {
	// Bwrap are the images spec.bwrap.image may name; a bwrap Sandbox
	// without an image (the node's directories) needs no entry.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +listType=set
	// +optional
	Bwrap []string `json:"bwrap,omitempty"`
	// Containerd are the images spec.containerd.image may name.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +listType=set
	// +optional
	Containerd []string `json:"containerd,omitempty"`
	// Incus are the images spec.incus.image may name.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +listType=set
	// +optional
	Incus []string `json:"incus,omitempty"`
}

// ClassLimits are resource limits of the containerd and incus backends.
type ClassLimits struct {
	// MemoryLimit bounds the memory limit of every backend where
	// MaxResources (DefaultResources) gives none. Deprecated: use those.
	// +optional
	MemoryLimit *resource.Quantity `json:"memoryLimit,omitempty"`
	// PidsLimit bounds the pids limit of every backend where MaxResources
	// (DefaultResources) gives none. Deprecated: use those.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4194304
	// +optional
	PidsLimit *int64 `json:"pidsLimit,omitempty"`
	// RootfsSizeLimit bounds spec.containerd.rootfsSizeLimit.
	// +optional
	RootfsSizeLimit *resource.Quantity `json:"rootfsSizeLimit,omitempty"`
	// RootSizeLimit bounds spec.incus.rootSizeLimit.
	// +optional
	RootSizeLimit *resource.Quantity `json:"rootSizeLimit,omitempty"`
}

// SandboxClassSpec is what the Sandboxes of a class may ask for. A class
// allows only what it lists: an empty list allows nothing.
// +kubebuilder:validation:XValidation:rule="!has(self.defaultLimits) || !has(self.maxLimits) || !has(self.defaultLimits.memoryLimit) || !has(self.maxLimits.memoryLimit) || !quantity(string(self.defaultLimits.memoryLimit)).isGreaterThan(quantity(string(self.maxLimits.memoryLimit)))",message="defaultLimits.memoryLimit must not be above maxLimits.memoryLimit"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultLimits) || !has(self.maxLimits) || !has(self.defaultLimits.pidsLimit) || !has(self.maxLimits.pidsLimit) || self.defaultLimits.pidsLimit <= self.maxLimits.pidsLimit",message="defaultLimits.pidsLimit must not be above maxLimits.pidsLimit"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultLimits) || !has(self.maxLimits) || !has(self.defaultLimits.rootfsSizeLimit) || !has(self.maxLimits.rootfsSizeLimit) || !quantity(string(self.defaultLimits.rootfsSizeLimit)).isGreaterThan(quantity(string(self.maxLimits.rootfsSizeLimit)))",message="defaultLimits.rootfsSizeLimit must not be above maxLimits.rootfsSizeLimit"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultLimits) || !has(self.maxLimits) || !has(self.defaultLimits.rootSizeLimit) || !has(self.maxLimits.rootSizeLimit) || !quantity(string(self.defaultLimits.rootSizeLimit)).isGreaterThan(quantity(string(self.maxLimits.rootSizeLimit)))",message="defaultLimits.rootSizeLimit must not be above maxLimits.rootSizeLimit"
type SandboxClassSpec struct {
	// AllowedBackends are the backends a Sandbox of this class may use.
	// +kubebuilder:validation:MaxItems=3
	// +listType=set
	// +optional
	AllowedBackends []Backend `json:"allowedBackends,omitempty"`

	// AllowedMountSourceRoots are the host directories mount sources must
	// be, or lie beneath. The controller expands ~/ and then resolves a
	// source beneath the root that holds it, on every act: symbolic links
	// are followed only while they stay beneath that root (an absolute
	// link target is refused), /proc magic links never, and /proc and /sys
	// are refused. Empty: no custom mounts.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:XValidation:rule="self == '/' || (self.startsWith('/') && !self.endsWith('/') && !self.substring(1).split('/').exists(s, s == '' || s == '.' || s == '..'))",message="allowedMountSourceRoots are absolute directories without '.', '..', empty segments or a trailing '/' ('/' alone allows every directory)"
	// +listType=set
	// +optional
	AllowedMountSourceRoots []string `json:"allowedMountSourceRoots,omitempty"`

	// AllowedEnv are the variables of the controller's environment a
	// Sandbox of this class may pass into its commands
	// (spec.env.passthrough): exact names, or a prefix followed by '*'
	// ("LC_*"; "*" alone allows every variable). Empty: none.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^([A-Za-z_][A-Za-z0-9_]*[*]?|[*])$')",message="allowedEnv entries are variable names, or a name prefix followed by '*' ('*' alone allows every variable)"
	// +listType=set
	// +optional
	AllowedEnv []string `json:"allowedEnv,omitempty"`

	// MaxMounts bounds the number of spec.mounts; without it the Sandbox's
	// own bound (64) applies.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	// +optional
	MaxMounts *int32 `json:"maxMounts,omitempty"`

	// Devices says which of spec.devices a Sandbox may turn on.
	// +optional
	Devices ClassDevices `json:"devices,omitempty"`

	// AllowedImages are the images of the bwrap, containerd and incus
	// backends.
	// +optional
	AllowedImages ClassImages `json:"allowedImages,omitempty"`

	// AllowedIncusProfiles are the Incus profiles a Sandbox may name in
	// spec.incus.profiles ("*": any). Empty: none, and its instance gets
	// the server's default profile. Of a profile's devices an instance
	// keeps only the root disk; its other settings apply.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	AllowedIncusProfiles []string `json:"allowedIncusProfiles,omitempty"`

	// AgentIDs is the FIRST:COUNT block of host ids the agents of this
	// class run as. It must lie in the controller's --agent-ids: the
	// controller gives a new agent an id of this block and refuses an
	// agent whose id, given before, lies outside it. Empty: any id of the
	// controller's range.
	// +kubebuilder:validation:MaxLength=21
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]{1,10}:[0-9]{1,10}$')",message="agentIDs is FIRST:COUNT, two decimal numbers"
	// +optional
	AgentIDs string `json:"agentIDs,omitempty"`

	// AllowedEgress are the hosts a Sandbox of this class may list in
	// spec.network.allow: a name, "*." and a domain (which covers the
	// names below it and the wildcards below it), an IP address, or "*"
	// for any host. Empty: egress Allowlist is refused, so the class's
	// Sandboxes reach no network.
	// +kubebuilder:validation:MaxItems=128
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:XValidation:rule=`self == '*' || isIP(self) || self.matches(r'^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])+[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')`,message="allowedEgress entries are hosts as in a Sandbox's network.allow, or '*' for any host"
	// +listType=set
	// +optional
	AllowedEgress []string `json:"allowedEgress,omitempty"`

	// AllowedEgressNetworks are internal address ranges (private,
	// link-local, shared, cluster) the proxy of this class's
	// Sandboxes may connect to when an allowed name resolves into them.
	// Empty: never; public addresses only. No range opens the node's own
	// addresses or loopback: the proxy connects from the node, where they
	// reach every service the node runs.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="allowedEgressNetworks entries are address ranges in CIDR notation, such as 10.0.0.0/8"
	// +listType=set
	// +optional
	AllowedEgressNetworks []string `json:"allowedEgressNetworks,omitempty"`

	// DefaultResources apply, field by field, where a Sandbox sets none of
	// its own (spec.resources), on every backend.
	// +optional
	DefaultResources *Resources `json:"defaultResources,omitempty"`

	// MaxResources bound what a Sandbox may set in spec.resources, on every
	// backend. A Sandbox that sets nothing gets the default, else the
	// maximum.
	// +optional
	MaxResources *Resources `json:"maxResources,omitempty"`

	// DefaultLimits apply where a Sandbox sets no limit of its own. The
	// controller applies them to the instance it starts; the Sandbox's spec
	// is never written.
	// +optional
	DefaultLimits *ClassLimits `json:"defaultLimits,omitempty"`

	// MaxLimits bound what a Sandbox may set. A Sandbox that sets no limit
	// gets the default, else the maximum.
	// +optional
	MaxLimits *ClassLimits `json:"maxLimits,omitempty"`

	// Scheduling says which of a Sandbox's scheduling fields that reach
	// past its own placement a Sandbox of this class may set.
	// +optional
	Scheduling ClassScheduling `json:"scheduling,omitempty"`
}

// ClassScheduling says which scheduling fields a Sandbox may hand its Pod.
// The controller makes the Pod in the Sandbox's namespace, so a tenant who
// may not create Pods still gets one with them: a priority that preempts
// other Pods, a toleration of a node kept for others, an anti-affinity
// that keeps other Pods off a node, a node pinned past kube-scheduler.
// spec.nodeSelector, node affinity and topology spread constraints only
// narrow where the Sandbox's own Pod goes, and are always allowed.
type ClassScheduling struct {
	// AllowedPriorityClassNames are the PriorityClasses a Sandbox may name
	// in spec.priorityClassName ("*": any). Empty: none, and its Pod gets
	// the cluster's default priority.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	AllowedPriorityClassNames []string `json:"allowedPriorityClassNames,omitempty"`

	// AllowedTolerations are the taint keys a Sandbox may tolerate in
	// spec.tolerations ("*": any key, and a toleration of every taint,
	// which names no key). Empty: no tolerations; the controller's own,
	// for a node not ready or unreachable, are always added.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=316
	// +listType=set
	// +optional
	AllowedTolerations []string `json:"allowedTolerations,omitempty"`

	// PodAffinity allows spec.affinity.podAffinity and podAntiAffinity. A
	// Pod's required anti-affinity keeps every Pod it selects off the
	// nodes (or zones) where it runs, not only itself off theirs.
	// +optional
	PodAffinity bool `json:"podAffinity,omitempty"`

	// NodeName allows spec.nodeName: a Sandbox pinned to a node, bound
	// there past kube-scheduler (its taints and priorities).
	// +optional
	NodeName bool `json:"nodeName,omitempty"`
}

// SandboxClass is an administrator's statement of what the Sandboxes that
// name it (spec.className), or all Sandboxes without a class when it is
// marked default, may use on a node: backends, host directories, devices,
// images, agent ids and resource limits. Without any SandboxClass in the
// cluster, Sandboxes are not restricted by class.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=sbxclass,categories=cireilclaw
// +kubebuilder:printcolumn:name="Default",type=string,JSONPath=`.metadata.labels.sandboxclass\.sandbox\.cireilclaw\.dev/is-default-class`
// +kubebuilder:printcolumn:name="Backends",type=string,JSONPath=`.spec.allowedBackends`
// +kubebuilder:printcolumn:name="Roots",type=string,JSONPath=`.spec.allowedMountSourceRoots`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SandboxClassSpec `json:"spec"`
}

// SandboxClassList is a list of SandboxClasses.
// +kubebuilder:object:root=true
type SandboxClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClass `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SandboxClass{}, &SandboxClassList{})
}
