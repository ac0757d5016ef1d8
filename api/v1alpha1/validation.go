package v1alpha1

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/internal/commandname"
	"github.com/cireilclaw/sandbox-controller/internal/pattern"
)

// The messages of the admission rules. Each one is also the message of a CEL
// rule in the markers above the field it checks; a test keeps the two sets
// equal, so a user sees the same words from kubectl apply and from the
// sandbox.toml loader.
const (
	MsgMountSource        = "mount sources must be absolute paths or begin with ~/"
	MsgMountTargetAbs     = "mount targets are relative paths below /workspace/, not absolute paths"
	MsgMountTargetDots    = "mount targets must not contain '.' or '..' segments"
	MsgMountTargetEmpty   = "mount targets must not contain empty segments (no leading, trailing or doubled '/')"
	MsgMountMode          = "mount modes are ro, rw or overlay"
	MsgMountSizeLimit     = "sizeLimit applies to mounts with mode overlay only"
	MsgMountSizePositive  = "sizeLimit must be at least 64Ki, the smallest file system that can hold an upper layer (leave it out for no limit)"
	MsgMountOverlap       = "mount targets must not overlap: configure sibling targets rather than nesting one below another"
	MsgBinarySpace        = commandname.MsgSpace
	MsgBinaryMeta         = commandname.MsgMeta
	MsgBinarySlash        = commandname.MsgSlash
	MsgEnvName            = "environment variable names contain only letters, digits and '_' and do not start with a digit"
	MsgAgentLabel         = "agent must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"
	MsgAgentImmutable     = "agent is immutable: create a new Sandbox for another agent"
	MsgBackendImmutable   = "backend is immutable: delete and recreate the Sandbox to change it"
	MsgIncusRequired      = "backend incus requires the incus table (spec.incus with an image)"
	MsgContainerdRequired = "backend containerd requires the containerd table (spec.containerd with an image)"
	MsgBwrapOnly          = "spec.bwrap applies to backend bwrap only"
	MsgBwrapImage         = "spec.bwrap.image is an image reference: no spaces or control characters"
	MsgSandboxNameImmut   = "sandboxName is immutable: create a new SessionClaim for another Sandbox"
	MsgWorktreeImmutable  = "worktree is immutable: create a new SessionClaim for another worktree"
	MsgWorktreeRepository = "worktree repository is a relative path below /workspace/ without '.', '..' or empty segments"
	MsgWorktreeName       = "worktree name contains only letters, digits, '.', '_' and '-' and starts with a letter or digit"
	MsgWorktreeNameRef    = "worktree name is a git branch name, so no '..' and not ending in '.' or '.lock'"
	MsgWorktreeRef        = "worktree ref follows git's ref name rules (git check-ref-format) and does not start with '-', so no '..', '//', '@{', blanks, control characters, colon, backslash or any of ~ ^ ? * [; no part starting with '.' or ending in '.lock'; not starting or ending with '/', not ending with '.', not '@'"
)

// ShellMetacharacters are the characters a binary name (and the command of
// an exec request) must not contain: each means something to a shell.
const ShellMetacharacters = commandname.ShellMetacharacters

// MaxAgentLength keeps cireilclaw-{agent} within the 63 characters that
// instance names and label values allow.
const MaxAgentLength = 52

var (
	agentPattern   = pattern.Lazy(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	envNamePattern = pattern.Lazy(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// InstanceName is the runtime instance name of an agent, as the seed names it.
func InstanceName(agent string) string { return "cireilclaw-" + agent }

// BackendOrDefault is the backend, with the default applied.
func (s *SandboxSpec) BackendOrDefault() Backend {
	if s.Backend == "" {
		return BackendBwrap
	}
	return s.Backend
}

// ValidateSandboxSpec applies the admission rules every backend shares to
// a spec that did not come through the API server (sandbox.toml), and again
// in the controller so that a CRD installed without its rules cannot widen
// a sandbox. Whether spec.backend names a backend, and that backend's own
// rules, are the backend registry's (bridge/backend.ValidateSpec, which
// calls this): the API cannot know which backends a build registers.
func ValidateSandboxSpec(spec *SandboxSpec) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")

	if msg := CheckAgent(spec.Agent); msg != "" {
		errs = append(errs, field.Invalid(p.Child("agent"), spec.Agent, msg))
	}

	mp := p.Child("mounts")
	for i, m := range spec.Mounts {
		if msg := CheckMountSource(m.Source); msg != "" {
			errs = append(errs, field.Invalid(mp.Index(i).Child("source"), m.Source, msg))
		}
		for _, msg := range CheckMountTarget(m.Target) {
			errs = append(errs, field.Invalid(mp.Index(i).Child("target"), m.Target, msg))
		}
		if m.Mode != "" && m.Mode != MountReadOnly && m.Mode != MountReadWrite && m.Mode != MountOverlay {
			errs = append(errs, field.Invalid(mp.Index(i).Child("mode"), m.Mode, MsgMountMode))
		}
		if m.SizeLimit != nil && m.Mode != MountOverlay {
			errs = append(errs, field.Invalid(mp.Index(i).Child("sizeLimit"), m.SizeLimit.String(), MsgMountSizeLimit))
		}
		if m.SizeLimit != nil && m.SizeLimit.Cmp(minSizedFS) < 0 {
			errs = append(errs, field.Invalid(mp.Index(i).Child("sizeLimit"), m.SizeLimit.String(), MsgMountSizePositive))
		}
	}
	if i, j, ok := OverlappingTargets(spec.Mounts); ok {
		errs = append(errs, field.Invalid(mp, fmt.Sprintf("%q and %q", spec.Mounts[i].Target, spec.Mounts[j].Target), MsgMountOverlap))
	}

	for i, b := range spec.Binaries {
		if msg := CheckBinaryName(string(b)); msg != "" {
			errs = append(errs, field.Invalid(p.Child("binaries").Index(i), b, msg))
		}
	}
	for i, n := range spec.Env.Passthrough {
		if !envNamePattern().MatchString(string(n)) {
			errs = append(errs, field.Invalid(p.Child("env", "passthrough").Index(i), n, MsgEnvName))
		}
	}
	errs = append(errs, validateNetwork(spec.Network, p.Child("network"))...)
	errs = append(errs, validateBwrap(spec, p.Child("bwrap"))...)
	errs = append(errs, validateInput(spec, p)...)
	return errs
}

// validateBwrap applies the rules of spec.bwrap: the bwrap backend's
// table, and an image reference without blanks or control characters
// (the CRD's CEL says the same).
func validateBwrap(spec *SandboxSpec, p *field.Path) field.ErrorList {
	b := spec.Bwrap
	if b == nil {
		return nil
	}
	var errs field.ErrorList
	if spec.BackendOrDefault() != BackendBwrap {
		errs = append(errs, field.Invalid(p, spec.BackendOrDefault(), MsgBwrapOnly))
	}
	if b.Image != "" && !imageRefPattern().MatchString(b.Image) {
		errs = append(errs, field.Invalid(p.Child("image"), b.Image, MsgBwrapImage))
	}
	return errs
}

var imageRefPattern = pattern.Lazy(`^[^\s\p{C}]+$`)

var worktreeNamePattern = pattern.Lazy(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidateWorktree applies the admission rules of spec.worktree.
func ValidateWorktree(w *WorktreeSpec) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec", "worktree")
	if w.Repository == "" || strings.HasPrefix(w.Repository, "/") || len(CheckMountTarget(w.Repository)) > 0 {
		errs = append(errs, field.Invalid(p.Child("repository"), w.Repository, MsgWorktreeRepository))
	}
	if w.Name != "" && (len(w.Name) > 63 || !worktreeNamePattern().MatchString(w.Name)) {
		errs = append(errs, field.Invalid(p.Child("name"), w.Name, MsgWorktreeName))
	}
	if w.Name != "" && CheckWorktreeRef(w.Name) != "" {
		errs = append(errs, field.Invalid(p.Child("name"), w.Name, MsgWorktreeNameRef))
	}
	if msg := CheckWorktreeRef(w.Ref); w.Ref != "" && msg != "" {
		errs = append(errs, field.Invalid(p.Child("ref"), w.Ref, msg))
	}
	return errs
}

// CheckWorktreeRef returns the rule a worktree ref (or name, which becomes
// a branch) breaks, or "". The rules are git check-ref-format's with
// --allow-onelevel, and nothing may start with '-': host git is given this
// string, and one that reads as an option (--checkout) would change what it
// does. The CEL rule on WorktreeSpec.Ref says the same.
func CheckWorktreeRef(ref string) string {
	switch {
	case ref == "", ref == "@",
		strings.HasPrefix(ref, "-"), strings.HasPrefix(ref, "/"),
		strings.HasSuffix(ref, "/"), strings.HasSuffix(ref, "."),
		strings.Contains(ref, ".."), strings.Contains(ref, "//"), strings.Contains(ref, "@{"):
		return MsgWorktreeRef
	}
	for _, r := range ref {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(" ~^:?*[\\", r) {
			return MsgWorktreeRef
		}
	}
	for _, part := range strings.Split(ref, "/") {
		if strings.HasPrefix(part, ".") || strings.HasSuffix(part, ".lock") {
			return MsgWorktreeRef
		}
	}
	return ""
}

// CheckAgent returns the rule an agent slug breaks, or "".
func CheckAgent(agent string) string {
	if len(agent) == 0 || len(agent) > MaxAgentLength || !agentPattern().MatchString(agent) {
		return MsgAgentLabel
	}
	return ""
}

// CheckMountSource returns the rule a mount source breaks, or "".
func CheckMountSource(src string) string {
	if strings.HasPrefix(src, "/") || strings.HasPrefix(src, "~/") {
		return ""
	}
	return MsgMountSource
}

// CheckMountTarget returns the rules a mount target breaks.
func CheckMountTarget(target string) []string {
	if strings.HasPrefix(target, "/") {
		return []string{MsgMountTargetAbs}
	}
	var out []string
	segs := strings.Split(target, "/")
	for _, s := range segs {
		if s == "." || s == ".." {
			out = append(out, MsgMountTargetDots)
			break
		}
	}
	for _, s := range segs {
		if s == "" {
			out = append(out, MsgMountTargetEmpty)
			break
		}
	}
	return out
}

// OverlappingTargets reports the first pair of mounts whose targets are equal
// or nested one below the other.
func OverlappingTargets(mounts []Mount) (int, int, bool) {
	for i := range mounts {
		for j := range mounts {
			if i == j {
				continue
			}
			a, b := mounts[i].Target, mounts[j].Target
			if (a == b && i < j) || strings.HasPrefix(b, a+"/") {
				return i, j, true
			}
		}
	}
	return 0, 0, false
}

// CheckBinaryName returns the rule a binary name breaks, or "": the rule
// of internal/commandname, which the exec policy applies to every command.
func CheckBinaryName(name string) string { return commandname.Check(name) }
