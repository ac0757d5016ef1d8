package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Backend names the runtime that runs an agent's commands.
// +kubebuilder:validation:Enum=bwrap;containerd;incus
type Backend string

const (
	// BackendBwrap runs each command in a fresh bubblewrap namespace.
	BackendBwrap Backend = "bwrap"
	// BackendContainerd keeps one containerd container per agent.
	BackendContainerd Backend = "containerd"
	// BackendIncus keeps one Incus system container per agent.
	BackendIncus Backend = "incus"
)

// MountMode says whether the sandbox may write to a mount.
type MountMode string

const (
	// MountReadOnly exposes the source read-only.
	MountReadOnly MountMode = "ro"
	// MountReadWrite exposes the source read-write.
	MountReadWrite MountMode = "rw"
	// MountOverlay exposes the source as the read-only lower layer of an
	// overlay: the sandbox's writes go to a per-sandbox upper layer and reach
	// the source only when applied (sandboxctl diff / apply).
	MountOverlay MountMode = "overlay"
)

// Mount exposes a host directory inside the sandbox below /workspace/.
// +kubebuilder:validation:XValidation:rule="!has(self.sizeLimit) || (has(self.mode) && self.mode == 'overlay')",message="sizeLimit applies to mounts with mode overlay only"
type Mount struct {
	// Source is the host directory to expose. It must be an absolute path or
	// begin with ~/ (the controller's home directory).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') || self.startsWith('~/')",message="mount sources must be absolute paths or begin with ~/"
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(s, s == '..')",message="mount sources must not contain '..' segments: a ~/ source stays inside the home directory"
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[^\p{C}\p{Zl}\p{Zp}]*$')`,message="mount sources contain only printable characters: no control, line-separator, bidirectional or zero-width characters"
	Source string `json:"source"`

	// Target is where the source appears, as a relative path below
	// /workspace/ ("project" appears at /workspace/project). Targets of one
	// sandbox must not overlap: configure sibling targets rather than nesting
	// one below another.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="mount targets are relative paths below /workspace/, not absolute paths"
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(s, s == '..' || s == '.')",message="mount targets must not contain '.' or '..' segments"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') || !self.split('/').exists(s, s == '')",message="mount targets must not contain empty segments (no leading, trailing or doubled '/')"
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[^\p{C}\p{Zl}\p{Zp}]*$')`,message="mount targets contain only printable characters: no control, line-separator, bidirectional or zero-width characters"
	Target string `json:"target"`

	// Mode is ro (read-only), rw (read-write) or overlay (the source
	// read-only below, writes kept in a per-sandbox upper layer until
	// applied). Defaults to ro.
	// +kubebuilder:default=ro
	// +kubebuilder:validation:XValidation:rule="self == 'ro' || self == 'rw' || self == 'overlay'",message="mount modes are ro, rw or overlay"
	// +optional
	Mode MountMode `json:"mode,omitempty"`

	// SizeLimit bounds the upper layer of an overlay mount: the layer is
	// kept on a file system of that size, so a write beyond it fails with
	// "no space left on device" (ENOSPC). Only for mode overlay, and at
	// least 64Ki: the controller refuses a smaller limit (InvalidSpec). A
	// limit made smaller than what the layer holds is reported as
	// OverlayHealthy=False reason UpperDirOverLimit.
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`
}

// BinaryName is a host command made available to exec: a bare name looked
// up on the host, never a path or a shell fragment.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=255
// +kubebuilder:validation:XValidation:rule="!self.matches('[[:space:]]')",message="binaries must not contain spaces; arguments are passed separately"
// +kubebuilder:validation:XValidation:rule="!self.matches('[|&;<>()$`\\\\\\\\\"\\'*?\\\\[\\\\]{}#~!]')",message="binaries must not contain shell metacharacters; arguments are passed separately"
// +kubebuilder:validation:XValidation:rule="!self.contains('/')",message="binaries are command names, not paths: they must not contain '/'"
// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9_+][A-Za-z0-9._+-]*$')",message="binaries contain only letters, digits, '.', '_', '+' and '-' and do not start with '-' or '.'"
type BinaryName string

// EnvVarName is the name of an environment variable.
// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",message="environment variable names contain only letters, digits and '_' and do not start with a digit"
// +kubebuilder:validation:MaxLength=255
type EnvVarName string

// Devices says which host devices the sandbox sees. Device access is opt-in.
type Devices struct {
	// USB exposes the host's USB device nodes.
	// +optional
	USB bool `json:"usb,omitempty"`
	// All exposes the host /dev. It is substantially broader than usb.
	// +optional
	All bool `json:"all,omitempty"`
}

// Environment configures what the command environment takes from the runtime.
type Environment struct {
	// Passthrough names variables copied from the runtime's own environment
	// into every command. Nothing else of the runtime's environment leaks in.
	// +kubebuilder:validation:MaxItems=128
	// +listType=set
	// +optional
	Passthrough []EnvVarName `json:"passthrough,omitempty"`
}

// ResourceAmounts are amounts of CPU and memory in Kubernetes' units
// ("500m" or "2" CPUs, "512Mi" of memory).
type ResourceAmounts struct {
	// CPU in cores: "250m" is a quarter of one.
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`
	// Memory in bytes: "512Mi". The 64 MiB /tmp is a tmpfs and counts
	// against a memory limit.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// Resources bound what a Sandbox's commands use together, on every
// backend: a bwrap Sandbox's commands share a cgroup of their own, a
// containerd or Incus instance is limited as a whole. Requests are what a
// scheduler reserves; limits are enforced (CPU by throttling, memory by
// the kernel's OOM killer, processes by refusing fork).
type Resources struct {
	// Requests are what the Sandbox is expected to use.
	// +optional
	Requests ResourceAmounts `json:"requests,omitempty"`
	// Limits are what it may not exceed.
	// +optional
	Limits ResourceAmounts `json:"limits,omitempty"`
	// PidsLimit caps the processes and threads of the Sandbox's commands
	// together, from 1 to 4194304 (the kernel's largest pid_max). Without
	// a SandboxClass saying otherwise it is DefaultPidsLimit.
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 4194304",message="pidsLimit must be between 1 and 4194304 (the kernel's largest pid_max)"
	// +optional
	PidsLimit *int64 `json:"pidsLimit,omitempty"`
}

// DefaultPidsLimit is the pids limit of a Sandbox that sets none and whose
// class (if any) gives none: enough for builds and test runners, far below
// what it takes to exhaust a node's process table.
const DefaultPidsLimit = 2048

// BwrapSpec configures the bwrap backend.
type BwrapSpec struct {
	// Image, on a cluster, is an image whose file system the Sandbox's
	// commands see as their system directories (/usr, /bin, /lib and the
	// rest, and the account, loader and certificate files of /etc) in
	// place of the node's: the image of the Sandbox's Pod's container,
	// pulled by the kubelet like any Pod's (imagePullPolicy, the
	// imagePullSecrets below and those of the namespace's default
	// ServiceAccount). Only binaries found in the image run, and only the
	// allowlisted ones are visible; the areas, /tmp, devices, environment
	// and identity rules are unchanged, and nothing of the image runs but
	// the allowlisted commands (its entrypoint and user are ignored).
	// Empty: the node's (on one machine, the host's) directories.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[^\s\p{C}]+$')`,message="spec.bwrap.image is an image reference: no spaces or control characters"
	// +optional
	Image string `json:"image,omitempty"`
	// ImagePullPolicy is the Pod's: Always, IfNotPresent or Never;
	// empty: as Kubernetes defaults it (Always for :latest or no tag,
	// else IfNotPresent).
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	// ImagePullSecrets name Secrets of the Sandbox's namespace the
	// kubelet pulls the image with, added to those of the namespace's
	// default ServiceAccount.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +listType=set
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
}

// ContainerdSpec configures the containerd backend.
type ContainerdSpec struct {
	// Image is the image reference the container is created from. It must be
	// present in the controller's containerd namespace; it is never pulled.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// MemoryLimit caps the container's memory. Deprecated: use
	// spec.resources.limits.memory, which every backend enforces; this
	// field is read when that one is unset, for one more release.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || quantity(string(self)).isGreaterThan(quantity('0'))",message="memoryLimit must be more than zero (leave it out for no limit)"
	// +optional
	MemoryLimit *resource.Quantity `json:"memoryLimit,omitempty"`
	// PidsLimit caps the number of processes in the container, from 1 to
	// 4194304 (the kernel's largest pid_max). Deprecated: use
	// spec.resources.pidsLimit, read when that one is unset.
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 4194304",message="pidsLimit must be between 1 and 4194304 (the kernel's largest pid_max)"
	// +optional
	PidsLimit *int64 `json:"pidsLimit,omitempty"`
	// RootfsSizeLimit is the most the container's writable layer holds: the
	// layer is kept on a file system of that size, so writes beyond it
	// fail (ENOSPC). At least 64Ki.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || quantity(string(self)).compareTo(quantity('64Ki')) >= 0",message="rootfsSizeLimit must be at least 64Ki, the smallest file system that can hold a writable layer (leave it out for no limit)"
	// +optional
	RootfsSizeLimit *resource.Quantity `json:"rootfsSizeLimit,omitempty"`
}

// IncusSpec configures the Incus backend (the seed's [incus] table).
type IncusSpec struct {
	// Image is any image reference accepted by the Incus server.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// Profiles are applied when the instance is created.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Profiles []string `json:"profiles,omitempty"`
	// Project is the Incus project; empty means the caller's current project.
	// +optional
	Project string `json:"project,omitempty"`
	// ShutdownOnExit says whether the controller stops the agent's instance
	// when it exits. With false the instance keeps running and a restarted
	// controller reuses it.
	// +kubebuilder:default=true
	// +optional
	ShutdownOnExit *bool `json:"shutdownOnExit,omitempty"`
	// RootSizeLimit is the size the instance's root volume may reach before
	// OverlayHealthy turns False.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || quantity(string(self)).isGreaterThan(quantity('0'))",message="rootSizeLimit must be more than zero (leave it out for no limit)"
	// +optional
	RootSizeLimit *resource.Quantity `json:"rootSizeLimit,omitempty"`
}

// RestartPolicy says when a change a running instance cannot take live is applied.
// +kubebuilder:validation:Enum=WhenIdle;Immediate
type RestartPolicy string

const (
	// RestartWhenIdle applies the change once no claim holds the instance.
	RestartWhenIdle RestartPolicy = "WhenIdle"
	// RestartImmediate restarts the instance at once, ending running commands.
	RestartImmediate RestartPolicy = "Immediate"
)

// EgressMode says what network a Sandbox's commands reach.
// +kubebuilder:validation:Enum=None;Allowlist
type EgressMode string

const (
	// EgressNone: no network at all, loopback only (the default).
	EgressNone EgressMode = "None"
	// EgressAllowlist: the hosts of spec.network.allow, through a proxy
	// the controller serves inside the Sandbox's own network namespace,
	// which has no other way out.
	EgressAllowlist EgressMode = "Allowlist"
)

// EgressRule is one destination a Sandbox may reach.
type EgressRule struct {
	// Host is a domain name ("github.com"), "*." and a domain for every
	// name below it but not the domain itself ("*.pythonhosted.org"), or an
	// IP address, the only way an address literal is allowed. Names are
	// resolved by the proxy, which never connects to the node's own
	// addresses or loopback, nor to link-local (cloud metadata), private or
	// cluster addresses unless the Sandbox's class allows them
	// (allowedEgressNetworks).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule=`isIP(self) || self.matches(r'^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])+[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')`,message="network.allow hosts are lowercase domain names of at least two labels, '*.' and such a name, or IP addresses"
	Host string `json:"host"`
	// Ports are the ports allowed at Host; empty means 443 and 80.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	// +listType=set
	// +optional
	Ports []int32 `json:"ports,omitempty"`
}

// Network says what a Sandbox's commands may reach beyond loopback.
// +kubebuilder:validation:XValidation:rule="self.?egress.orValue('None') == 'Allowlist' || !has(self.allow)",message="network.allow applies with egress Allowlist only"
// +kubebuilder:validation:XValidation:rule="self.?egress.orValue('None') != 'Allowlist' || (has(self.allow) && size(self.allow) > 0)",message="egress Allowlist needs at least one network.allow entry"
type Network struct {
	// Egress is None (the default: nothing beyond loopback) or Allowlist
	// (only the hosts of allow, through the Sandbox's proxy, which
	// commands find in HTTP_PROXY, HTTPS_PROXY and ALL_PROXY; a tool that
	// ignores them reaches nothing).
	// +kubebuilder:default=None
	// +optional
	Egress EgressMode `json:"egress,omitempty"`
	// Allow are the destinations of an Allowlist.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Allow []EgressRule `json:"allow,omitempty"`
}

// EgressOrDefault is spec.network.egress, None when unset.
func (s *SandboxSpec) EgressOrDefault() EgressMode {
	if s.Network == nil || s.Network.Egress == "" {
		return EgressNone
	}
	return s.Network.Egress
}

// SandboxSpec is what an agent's environment is.
// +kubebuilder:validation:XValidation:rule="self.backend != 'incus' || has(self.incus)",message="backend incus requires the incus table (spec.incus with an image)"
// +kubebuilder:validation:XValidation:rule="self.backend != 'containerd' || has(self.containerd)",message="backend containerd requires the containerd table (spec.containerd with an image)"
// +kubebuilder:validation:XValidation:rule="!has(self.bwrap) || self.backend == 'bwrap'",message="spec.bwrap applies to backend bwrap only"
type SandboxSpec struct {
	// Agent is the agent's slug, a DNS-1123 label of at most 52 characters.
	// The runtime instance is named cireilclaw-{agent} and the host areas
	// live in <areas-root>/{agent}/. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=52
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="agent must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="agent is immutable: create a new Sandbox for another agent"
	Agent string `json:"agent"`

	// Backend selects the runtime: bwrap (default, a fresh namespace per
	// command), containerd (one container per agent) or incus (one system
	// container per agent). Immutable.
	// +kubebuilder:default=bwrap
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="backend is immutable: delete and recreate the Sandbox to change it"
	// +optional
	Backend Backend `json:"backend,omitempty"`

	// ClassName names the SandboxClass that says what this Sandbox may use
	// (host directories, devices, images, backends, agent ids, limits).
	// Empty: the class marked default, if any. Without any SandboxClass in
	// the cluster, no class applies.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ClassName string `json:"className,omitempty"`

	// NodeName pins this sandbox to a node: that node's controller runs it,
	// and its Pod (on a cluster) is bound there without the scheduler.
	// Empty: on a cluster the Sandbox's Pod is scheduled by kube-scheduler
	// (by its resources, nodeSelector, affinity, tolerations, topology
	// spread and priority) among the nodes whose controller enables its
	// backend, and the node it is bound to runs it (status.nodeName); a
	// controller started without --node-name (one machine, `make run`) runs
	// every Sandbox that is neither pinned nor placed.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// NodeSelector limits placement to nodes whose Node object carries
	// every one of these labels with the given value: the Pod's
	// nodeSelector. It applies when the Sandbox is placed (or moved); a
	// placed Sandbox stays where it is when the selector or the labels
	// change.
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Affinity is the Pod's affinity, as for any Pod: node affinity, and
	// affinity or anti-affinity to other Pods. The controller adds one
	// required term of its own (a node whose controller enables the
	// Sandbox's backend).
	// +optional
	Affinity *Affinity `json:"affinity,omitempty"`

	// Tolerations are the Pod's tolerations, as for any Pod. The controller
	// adds those for a node that is not ready or unreachable (see
	// onNodeLost).
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Tolerations []Toleration `json:"tolerations,omitempty"`

	// TopologySpreadConstraints are the Pod's, as for any Pod; the Pods of
	// Sandboxes carry the label sandbox.cireilclaw.dev/sandbox-pod=true to
	// select them by.
	// +kubebuilder:validation:MaxItems=8
	// +optional
	TopologySpreadConstraints []TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`

	// PriorityClassName is the Pod's priority class: a Sandbox of a higher
	// priority may preempt the Pods of lower ones, and may be preempted.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// OnNodeLost says what happens when the node a Sandbox was placed on is
	// lost (its Node is not Ready, or unreachable). Stay (the default): the
	// Sandbox reports NodeLost and waits for the node; its Pod tolerates
	// the node's loss for ever. Move: its Pod tolerates the loss for
	// --node-lost-after and is then evicted; a new Pod is scheduled on
	// another node, which runs the Sandbox with the areas that node has for
	// its agent (usually none: areas are node-local); the areas on the lost
	// node stay there, untouched, and its instance there is removed when
	// that node's controller comes back. A pinned Sandbox (nodeName) always
	// stays.
	// +kubebuilder:validation:Enum=Stay;Move
	// +optional
	OnNodeLost NodeLostPolicy `json:"onNodeLost,omitempty"`

	// Mounts expose host directories inside the sandbox below /workspace/.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, b.target == a.target)) && self.all(a, self.all(b, !b.target.startsWith(a.target + '/')))",message="mount targets must not overlap: configure sibling targets rather than nesting one below another"
	// +optional
	Mounts []Mount `json:"mounts,omitempty"`

	// Binaries is the allowlist of host commands exec may run (the seed's
	// [bwrap] binaries). Commands are bare names; arguments are passed
	// separately, never through a shell.
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +optional
	Binaries []BinaryName `json:"binaries,omitempty"`

	// Devices opts into host device access.
	// +optional
	Devices Devices `json:"devices,omitempty"`

	// Env configures the command environment.
	// +optional
	Env Environment `json:"env,omitempty"`

	// Resources bound the CPU, memory and processes of the Sandbox's
	// commands, on every backend; a SandboxClass may give defaults and
	// maximums.
	// +optional
	Resources *Resources `json:"resources,omitempty"`

	// Network says what the commands may reach: nothing beyond loopback
	// (the default), or an allowlist of hosts through a proxy.
	// +optional
	Network *Network `json:"network,omitempty"`

	// Bwrap configures the bwrap backend: an image its commands see as
	// their system directories, on a cluster.
	// +optional
	Bwrap *BwrapSpec `json:"bwrap,omitempty"`

	// Containerd configures the containerd backend; required with it.
	// +optional
	Containerd *ContainerdSpec `json:"containerd,omitempty"`

	// Incus configures the Incus backend; required with it.
	// +optional
	Incus *IncusSpec `json:"incus,omitempty"`

	// IdleTimeout is how long the instance keeps running after its last
	// claim is released before it is stopped: a duration such as 30s, 5m or
	// 1h30m, more than zero and at most 720h (30 days). Defaults to 5m.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule=`self.size() <= 20 && self.matches(r'^(([0-9]{1,6}(\.[0-9]*)?|\.[0-9]+)(ns|us|ms|s|m|h))+$')`,message="idleTimeout is a duration such as 30s, 5m or 1h30m: at most 20 characters, numbers of at most 6 digits each followed by a unit (ns, us, ms, s, m or h)"
	// +kubebuilder:validation:XValidation:rule=`self.size() > 20 || !self.matches(r'^(([0-9]{1,6}(\.[0-9]*)?|\.[0-9]+)(ns|us|ms|s|m|h))+$') || (duration(self) > duration('0s') && duration(self) <= duration('720h'))`,message="idleTimeout must be more than zero and at most 720h (30 days)"
	// +optional
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`

	// KeepRunning keeps the instance running when no claim needs it.
	// +optional
	KeepRunning bool `json:"keepRunning,omitempty"`

	// RestartPolicy says when a change the running instance cannot take live
	// (a new image, for example) is applied: WhenIdle (default) once no claim
	// holds it, Immediate at once. Until then RuntimeReady is False with
	// reason RestartRequired.
	// +kubebuilder:default=WhenIdle
	// +optional
	RestartPolicy RestartPolicy `json:"restartPolicy,omitempty"`

	// undecoded are the fields Go could not decode (decode.go); they make
	// the spec invalid and are written back as they were read.
	undecoded []undecodedField `json:"-"`
}

// SandboxPod names a Sandbox's Pod.
type SandboxPod struct {
	// Name is the Pod's, in the Sandbox's namespace.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// UID is the Pod's.
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	UID string `json:"uid"`
	// ContainerID is the runtime's ID of the Pod's container once it runs
	// (containerd://<id>): the sandbox's processes run in its cgroup, which
	// the kubelet reports (kubectl top pod) and evicts by.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-z0-9.-]+://[0-9a-f]{64}$`
	// +optional
	ContainerID string `json:"containerID,omitempty"`
}

// SandboxStatus is what the controller observed.
type SandboxStatus struct {
	// ObservedGeneration is the generation the status was computed from.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Claims counts the SessionClaims bound to this Sandbox and not being deleted.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	Claims int32 `json:"claims"`
	// Instance is the runtime instance name, cireilclaw-{agent}.
	// +optional
	Instance string `json:"instance,omitempty"`
	// IdleSince is when the last claim was released while the instance was
	// running; the instance stops idleTimeout later.
	// +optional
	IdleSince *metav1.Time `json:"idleSince,omitempty"`
	// NodeName is the node whose controller runs the Sandbox: spec.nodeName
	// when pinned, else the node it was placed on. Empty while unplaced.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// PlacedAt is when the Sandbox was last placed on a node.
	// +optional
	PlacedAt *metav1.Time `json:"placedAt,omitempty"`
	// Pod is the Sandbox's Pod on a cluster, bound to nodeName: the
	// node's controller runs the Sandbox's processes in its cgroup, so the
	// kubelet accounts for them. Written by the aggregated API's placer.
	// +optional
	Pod *SandboxPod `json:"pod,omitempty"`
	// MountedGitDirs are the git directories of the claims' worktrees that
	// the running instance mounts at their host paths.
	// +optional
	MountedGitDirs []string `json:"mountedGitDirs,omitempty"`
	// Usage is what the running instance's commands use, from its cgroup
	// or runtime, refreshed every health interval when it changed; absent
	// while the instance is stopped or its runtime does not say.
	// +optional
	Usage *SandboxUsage `json:"usage,omitempty"`
	// Conditions: Ready (the instance is running and takes commands),
	// RuntimeReady (the instance is in the state the claims ask for),
	// OverlayHealthy (backends with a writable root) and GitHealthy (a
	// summary of the claims' worktrees; absent when none has one).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxUsage is what a running instance uses now.
type SandboxUsage struct {
	// Memory the commands use, rounded up to a MiB.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Processes (and threads) of the commands now.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Processes int64 `json:"processes"`
	// CPUSeconds the commands used since the instance started, whole seconds.
	// +kubebuilder:validation:Minimum=0
	// +optional
	CPUSeconds int64 `json:"cpuSeconds"`
	// OOMKills counts processes killed at the memory limit, and
	// PidsLimitRefusals forks refused at the pids limit, since the
	// instance started.
	// +kubebuilder:validation:Minimum=0
	// +optional
	OOMKills int64 `json:"oomKills,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	PidsLimitRefusals int64 `json:"pidsLimitRefusals,omitempty"`
}

// Sandbox declares one agent's least-privilege environment.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbx;sb,categories=cireilclaw
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.spec.backend`
// +kubebuilder:printcolumn:name="Claims",type=integer,JSONPath=`.status.claims`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Instance",type=string,JSONPath=`.status.instance`,priority=1
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`,priority=1
// +kubebuilder:printcolumn:name="Egress",type=string,JSONPath=`.spec.network.egress`,priority=1
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.status.usage.memory`,priority=1
// +kubebuilder:printcolumn:name="Procs",type=integer,JSONPath=`.status.usage.processes`,priority=1
// +kubebuilder:printcolumn:name="CPU(s)",type=integer,JSONPath=`.status.usage.cpuSeconds`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Sandbox{}, &SandboxList{})
}

// NodeLostPolicy is what happens to a placed Sandbox whose node is lost.
type NodeLostPolicy string

const (
	// NodeLostStay keeps the Sandbox on its node; it reports NodeLost.
	NodeLostStay NodeLostPolicy = "Stay"
	// NodeLostMove places the Sandbox on another node.
	NodeLostMove NodeLostPolicy = "Move"
)

// Node is the node whose controller runs sb: spec.nodeName when pinned,
// else the node it was placed on (status.nodeName); empty while unplaced.
func (sb *Sandbox) Node() string {
	if sb.Spec.NodeName != "" {
		return sb.Spec.NodeName
	}
	return sb.Status.NodeName
}

// ResourcesOrDeprecated is spec.resources, with the deprecated
// spec.containerd.memoryLimit and pidsLimit taken where it sets no memory
// limit or pids limit of its own.
func (s *SandboxSpec) ResourcesOrDeprecated() Resources {
	var r Resources
	if s.Resources != nil {
		r = *s.Resources.DeepCopy()
	}
	if c := s.Containerd; c != nil {
		if r.Limits.Memory == nil && c.MemoryLimit != nil {
			m := c.MemoryLimit.DeepCopy()
			r.Limits.Memory = &m
		}
		if r.PidsLimit == nil && c.PidsLimit != nil {
			p := *c.PidsLimit
			r.PidsLimit = &p
		}
	}
	return r
}

// UsesDeprecatedLimits names the deprecated fields spec sets, for a
// warning; nil when none.
func (s *SandboxSpec) UsesDeprecatedLimits() []string {
	var out []string
	if c := s.Containerd; c != nil {
		if c.MemoryLimit != nil {
			out = append(out, "spec.containerd.memoryLimit (use spec.resources.limits.memory)")
		}
		if c.PidsLimit != nil {
			out = append(out, "spec.containerd.pidsLimit (use spec.resources.pidsLimit)")
		}
	}
	return out
}
