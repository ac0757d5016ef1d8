package v1alpha1

// Condition types. Polarity follows the Gateway API convention: True is good.
const (
	// ConditionReady on a Sandbox: its instance is running and takes
	// commands. On a SessionClaim: the claim is bound and its Sandbox is Ready.
	ConditionReady = "Ready"
	// ConditionRuntimeReady on a Sandbox: the instance is in the state its
	// claims ask for (running while claims exist, stopped after idleTimeout).
	ConditionRuntimeReady = "RuntimeReady"
	// ConditionBound on a SessionClaim: the claim holds its Sandbox.
	ConditionBound = "Bound"
	// ConditionOverlayHealthy on a Sandbox: the instance's writable root
	// (containerd snapshot, Incus root volume) is present, mounted and within
	// its size limit. Absent for backends without one (bwrap).
	ConditionOverlayHealthy = "OverlayHealthy"
	// ConditionWorktreeReady on a SessionClaim with spec.worktree: the
	// worktree exists and is checked out inside the sandbox.
	ConditionWorktreeReady = "WorktreeReady"
	// ConditionGitHealthy on a SessionClaim with spec.worktree: git works in
	// the worktree, from the host and inside the sandbox. On a Sandbox: the
	// summary over its claims' worktrees (absent when none has one).
	ConditionGitHealthy = "GitHealthy"
	// ConditionSandboxEnforced on a bwrap Sandbox: commands run inside
	// bubblewrap. False (reason SandboxDisabled) when the controller runs
	// with the insecure disable variable set to one of its bypass values.
	ConditionSandboxEnforced = "SandboxEnforced"
	// ConditionWithinLimits on a running Sandbox whose runtime reports
	// usage: False once one of its commands was killed at its memory
	// limit (OOMKilled) or a fork was refused at its pids limit
	// (PidsLimitReached) since the instance started.
	ConditionWithinLimits = "WithinLimits"
)

// Condition reasons. Every reason a controller sets is one of these.
const (
	// ReasonRunning: the instance is running.
	ReasonRunning = "Running"
	// ReasonStopped: no claim needs the instance and it is not running.
	ReasonStopped = "Stopped"
	// ReasonIdle: no claim needs the instance; it keeps running until
	// idleTimeout has passed or, with keepRunning, indefinitely.
	ReasonIdle = "Idle"
	// ReasonNameConflict: another Sandbox on this node already uses the agent,
	// so the instance name cireilclaw-{agent}; the older Sandbox keeps it.
	ReasonNameConflict = "NameConflict"
	// ReasonInvalidSpec: the spec breaks an admission rule (a CRD installed
	// without its validation rules let it in).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonBackendUnavailable: this controller was not started with the
	// backend the Sandbox asks for.
	ReasonBackendUnavailable = "BackendUnavailable"
	// ReasonRuntimeUnavailable: the runtime's daemon or tool cannot be reached.
	ReasonRuntimeUnavailable = "RuntimeUnavailable"
	// ReasonRuntimeError: the runtime refused an operation; the message says which.
	ReasonRuntimeError = "RuntimeError"
	// ReasonDeleting: the Sandbox is being deleted.
	ReasonDeleting = "Deleting"
	// ReasonRestartRequired: the spec changed in a way the running instance
	// cannot take live; it is applied per spec.restartPolicy.
	ReasonRestartRequired = "RestartRequired"
	// ReasonEgressDenied (an Event): the Sandbox's proxy refused a
	// connection.
	ReasonEgressDenied = "EgressDenied"
	// ReasonImageNotFound: the image is not present where the runtime looks.
	ReasonImageNotFound = "ImageNotFound"
	// ReasonInstanceNotFound: the runtime has no such instance, or it is
	// not running, when an operation needs it.
	ReasonInstanceNotFound = "InstanceNotFound"
	// ReasonCommandRefused: the exec policy or the runtime refused a command
	// or the instance's description; nothing ran.
	ReasonCommandRefused = "CommandRefused"
	// ReasonIdmapNotPermitted: the Incus project does not permit raw.idmap
	// or the controller's UID and GID; the message names the settings.
	ReasonIdmapNotPermitted = "IdmapNotPermitted"
	// ReasonHostDisksNotPermitted: the Incus project does not permit the
	// host directories the areas and mounts need.
	ReasonHostDisksNotPermitted = "HostDisksNotPermitted"
	// ReasonHardeningNotPermitted: the Incus project does not permit the
	// low-level configuration (raw.lxc) every instance is hardened with;
	// the message names the setting.
	ReasonHardeningNotPermitted = "HardeningNotPermitted"
	// ReasonLimitsUnavailable: the Sandbox's resource limits cannot be
	// enforced on this node (no cgroup can be made); nothing runs
	// unlimited unless the controller was told to allow it.
	ReasonLimitsUnavailable = "LimitsUnavailable"
	// ReasonMountSourceMissing: a custom mount's host source does not
	// exist, is not a directory, or is a symbolic-link loop; the message
	// names the mount, the path and the problem. Commands could not run, so
	// the Sandbox and its claims are not Ready until the source is back.
	ReasonMountSourceMissing = "MountSourceMissing"
	// ReasonClassForbids: the Sandbox's SandboxClass does not allow
	// something it asks for; the message names the field and the class's
	// rule. Nothing is started and no area is created.
	ReasonClassForbids = "ClassForbids"

	// ReasonUnschedulable: the Sandbox's Pod waits for a node; the message
	// is the scheduler's (for example "0/3 nodes are available: 3
	// Insufficient memory"). It is placed once a node can take it.
	ReasonUnschedulable = "Unschedulable"
	// ReasonPodRefused: the API server refused the Sandbox's Pod (a
	// ResourceQuota, a LimitRange, Pod Security admission, a policy); the
	// message is the API server's. It is tried again every 15 seconds.
	ReasonPodRefused = "PodRefused"
	// ReasonPlaced: the Sandbox was placed on a node (status.nodeName) and
	// waits for that node's controller.
	ReasonPlaced = "Placed"
	// ReasonPodStarting: on a cluster, the Sandbox's Pod is not there yet
	// or the kubelet has not started its container, whose cgroup the
	// sandbox's processes run in; looked for again every 2 seconds.
	ReasonPodStarting = "PodStarting"
	// ReasonNodeLost: the Sandbox's Node is not Ready (or gone); the
	// message says since when and whether the Sandbox moves.
	ReasonNodeLost = "NodeLost"

	// ReasonWorktreeCreated: the worktree exists and is checked out.
	ReasonWorktreeCreated = "WorktreeCreated"
	// ReasonWaitingForSandbox: the worktree is checked out inside the sandbox,
	// which is not Ready yet.
	ReasonWaitingForSandbox = "WaitingForSandbox"
	// ReasonWorktreeFailed: making the worktree failed; the message says why.
	ReasonWorktreeFailed = "WorktreeFailed"
	// ReasonGitdirMissing: the worktree's .git file names a gitdir that is gone.
	ReasonGitdirMissing = "GitdirMissing"
	// ReasonGitdirMismatch: the gitdir's back-pointer names another worktree.
	ReasonGitdirMismatch = "GitdirMismatch"
	// ReasonWorktreeLocked: the worktree is locked.
	ReasonWorktreeLocked = "WorktreeLocked"
	// ReasonWorktreePrunable: git would prune the worktree (its directory is gone).
	ReasonWorktreePrunable = "WorktreePrunable"
	// ReasonHeadUnresolvable: the worktree's HEAD does not resolve to a commit.
	ReasonHeadUnresolvable = "HeadUnresolvable"
	// ReasonProbeFailed: git rev-parse inside the sandbox failed.
	ReasonProbeFailed = "ProbeFailed"
	// ReasonWorktreeKept: the claim went, its worktree had uncommitted
	// changes and was kept on disk.
	ReasonWorktreeKept = "WorktreeKept"

	// ReasonEnforced: commands run inside the sandbox.
	ReasonEnforced = "Enforced"
	// ReasonSandboxDisabled: commands run directly on the host because the
	// controller's environment disables the sandbox.
	ReasonSandboxDisabled = "SandboxDisabled"

	// ReasonHealthy: the writable root (containerd, incus) and the overlay
	// mounts are present, mounted and within their limits; GitHealthy: the
	// worktree's links and HEAD check out.
	ReasonHealthy = "Healthy"
	// ReasonSnapshotMissing: the container's snapshot is gone.
	ReasonSnapshotMissing = "SnapshotMissing"
	// ReasonNotMounted: the writable root is not mounted or a lower layer is missing.
	ReasonNotMounted = "NotMounted"
	// ReasonUpperDirOverLimit: the writable layer exceeds its size limit.
	ReasonUpperDirOverLimit = "UpperDirOverLimit"
	// ReasonSizeLimitNotEnforced: the storage of the writable layer cannot
	// hold it to its size limit (an Incus pool without quotas).
	ReasonSizeLimitNotEnforced = "SizeLimitNotEnforced"

	// ReasonWithinLimits: no command hit a resource limit since the
	// instance started.
	ReasonWithinLimits = "WithinLimits"
	// ReasonOOMKilled: a process of the Sandbox was killed at its memory limit.
	ReasonOOMKilled = "OOMKilled"
	// ReasonPidsLimitReached: a fork in the Sandbox was refused at its pids limit.
	ReasonPidsLimitReached = "PidsLimitReached"

	// ReasonBound: the claim holds its Sandbox.
	ReasonBound = "Bound"
	// ReasonSandboxNotFound: the named Sandbox does not exist in the claim's namespace (yet).
	ReasonSandboxNotFound = "SandboxNotFound"
	// ReasonSandboxDeleting: the named Sandbox is being deleted.
	ReasonSandboxDeleting = "SandboxDeleting"
	// ReasonSandboxReady: the claim's Sandbox is Ready.
	ReasonSandboxReady = "SandboxReady"
	// ReasonSandboxNotReady: the claim's Sandbox is not Ready yet; its
	// Ready condition says why.
	ReasonSandboxNotReady = "SandboxNotReady"
)

// Finalizer is set on both kinds so that the controller releases what it
// made (the claim's hold, the runtime instance) before an object goes.
const Finalizer = "sandbox.cireilclaw.dev/finalizer"
