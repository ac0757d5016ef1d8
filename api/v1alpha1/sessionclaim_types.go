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

	// Worktree asks for a git worktree of its own for this session. Immutable.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="worktree is immutable: create a new SessionClaim for another worktree"
	// +optional
	Worktree *WorktreeSpec `json:"worktree,omitempty"`
}

// WorktreeSpec is a git worktree added for one session inside a mount.
type WorktreeSpec struct {
	// Repository is the repository's path inside the sandbox, relative to
	// /workspace/: a mount target ("project") or a directory below one
	// ("project/service"). It must be a git repository on the host.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.split('/').exists(s, s == '..' || s == '.' || s == '')",message="worktree repository is a relative path below /workspace/ without '.', '..' or empty segments"
	Repository string `json:"repository"`

	// Ref is the branch or commit to check out. With createBranch, the new
	// branch starts here; empty means the repository's HEAD.
	// It follows git's ref name rules and never starts with '-': host git
	// is given it, and a ref that reads as an option would change what
	// git does (CheckWorktreeRef says the same in Go).
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule=`self == '' || (!self.startsWith('-') && !self.startsWith('/') && !self.endsWith('/') && !self.endsWith('.') && self != '@' && !self.contains('..') && !self.contains('//') && !self.contains('@{') && !self.contains('\\') && !self.matches('[[:cntrl:] ~^:?*[]') && !self.split('/').exists(p, p.startsWith('.') || p.endsWith('.lock')))`,message="worktree ref follows git's ref name rules (git check-ref-format) and does not start with '-', so no '..', '//', '@{', blanks, control characters, colon, backslash or any of ~ ^ ? * [; no part starting with '.' or ending in '.lock'; not starting or ending with '/', not ending with '.', not '@'"
	// +optional
	Ref string `json:"ref,omitempty"`

	// Name names the worktree (its directory and, with createBranch, its
	// branch). Defaults to the claim's name.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$')",message="worktree name contains only letters, digits, '.', '_' and '-' and starts with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="!self.contains('..') && !self.endsWith('.') && !self.endsWith('.lock')",message="worktree name is a git branch name, so no '..' and not ending in '.' or '.lock'"
	// +optional
	Name string `json:"name,omitempty"`

	// CreateBranch creates a branch named after the worktree at ref. The
	// branch and its commits stay when the claim goes.
	// +optional
	CreateBranch bool `json:"createBranch,omitempty"`
}

// WorktreeStatus reports a session's worktree.
type WorktreeStatus struct {
	// Path is the worktree inside the sandbox, e.g. /workspace/project/.worktrees/s1.
	Path string `json:"path"`
	// HostPath is the worktree on the controller's host.
	HostPath string `json:"hostPath"`
	// GitCommonDir is the repository's git directory on the host; it is
	// mounted at this same absolute path inside the sandbox so that the
	// worktree's .git file resolves there too, unless RelativePaths.
	GitCommonDir string `json:"gitCommonDir"`
	// RelativePaths says the worktree's links are relative (git 2.48 and
	// later with worktree.useRelativePaths, or written so by hand): the
	// worktree lies inside the repository's mount, so the links resolve
	// inside the sandbox through that mount and the git directory is not
	// mounted again at its host path.
	// +optional
	RelativePaths bool `json:"relativePaths,omitempty"`
	// Branch is the branch checked out, empty for a detached HEAD.
	// +optional
	Branch string `json:"branch,omitempty"`
	// Head is the commit checked out when the worktree was made.
	// +optional
	Head string `json:"head,omitempty"`
	// CheckedOut says the files have been checked out inside the sandbox.
	// +optional
	CheckedOut bool `json:"checkedOut,omitempty"`
	// Kept says the claim is going and its worktree was kept on disk
	// because it had uncommitted changes (or they could not be ruled out).
	// +optional
	Kept bool `json:"kept,omitempty"`
}

// SessionClaimStatus is what the controller observed.
type SessionClaimStatus struct {
	// ObservedGeneration is the generation the status was computed from.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Instance is the runtime instance the session's commands run in.
	// +optional
	Instance string `json:"instance,omitempty"`
	// Endpoint is the host:port of the exec and file API that serves this
	// claim (the controller on the Sandbox's node).
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// Worktree is what the controller made of spec.worktree.
	// +optional
	Worktree *WorktreeStatus `json:"worktree,omitempty"`
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
// +kubebuilder:printcolumn:name="Worktree",type=string,JSONPath=`.status.worktree.path`,priority=1
// +kubebuilder:printcolumn:name="Git",type=string,JSONPath=`.status.conditions[?(@.type=="GitHealthy")].reason`,priority=1
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
