package v1alpha1

import (
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/internal/pattern"
)

// The messages of the rules on fields Go decodes strictly (durations,
// quantities, bounded integers) and on names a person reads (sources,
// targets, binaries). They belong to the same table as validation.go's: the
// CEL markers carry them word for word and messages_test.go keeps the two
// sets equal.
const (
	MsgMountSourceDots   = "mount sources must not contain '..' segments: a ~/ source stays inside the home directory"
	MsgMountSourceChars  = "mount sources contain only printable characters: no control, line-separator, bidirectional or zero-width characters"
	MsgMountTargetChars  = "mount targets contain only printable characters: no control, line-separator, bidirectional or zero-width characters"
	MsgBinaryPortable    = "binaries contain only letters, digits, '.', '_', '+' and '-' and do not start with '-' or '.'"
	MsgIdleTimeoutFormat = "idleTimeout is a duration such as 30s, 5m or 1h30m: at most 20 characters, numbers of at most 6 digits each followed by a unit (ns, us, ms, s, m or h)"
	MsgIdleTimeoutRange  = "idleTimeout must be more than zero and at most 720h (30 days)"
	MsgPidsLimit         = "pidsLimit must be between 1 and 4194304 (the kernel's largest pid_max)"
	MsgMemoryPositive    = "memoryLimit must be more than zero (leave it out for no limit)"
	MsgRootfsPositive    = "rootfsSizeLimit must be at least 64Ki, the smallest file system that can hold a writable layer (leave it out for no limit)"
	MsgRootPositive      = "rootSizeLimit must be more than zero (leave it out for no limit)"
	// MsgResourcePositive and MsgRequestAboveLimit are Go rules only (as
	// MsgMountSizePositive): CEL on quantities costs more than the API
	// server allows.
	MsgResourcePositive  = "CPU and memory amounts must be more than zero (leave one out for no request or no limit)"
	MsgRequestAboveLimit = "a request must not be above the limit of the same resource"
)

// MaxIdleTimeout bounds spec.idleTimeout: an instance left running for
// longer than a month after its last claim is keepRunning's job.
const MaxIdleTimeout = 30 * 24 * time.Hour

// MaxPidsLimit is PID_MAX_LIMIT on 64-bit Linux: no pids.max above it means
// anything.
const MaxPidsLimit = 4194304

// The patterns are RE2, the engine of both Go's regexp and the API
// server's CEL matches(), so the two sides accept the same strings. The CEL
// markers in sandbox_types.go repeat them.
var (
	// printablePattern refuses control characters (Cc), format characters
	// (Cf: the bidirectional overrides and isolates, zero-width spaces and
	// joiners, byte order marks), surrogates, private-use characters and
	// line and paragraph separators: what would make a name read
	// differently from what it is.
	printablePattern = pattern.Lazy(`^[^\p{C}\p{Zl}\p{Zp}]*$`)
	// binaryPattern is the portable filename character set, with '+' for
	// names such as g++, and no leading '-' (an option) or '.' (hidden).
	binaryPattern = pattern.Lazy(`^[A-Za-z0-9_+][A-Za-z0-9._+-]*$`)
	// durationPattern is the subset of Go's duration syntax that cannot
	// overflow within 20 characters: no sign, at most 6 digits before a
	// unit, no µ.
	durationPattern = pattern.Lazy(`^(([0-9]{1,6}(\.[0-9]*)?|\.[0-9]+)(ns|us|ms|s|m|h))+$`)
)

// maxDurationLength bounds the duration string; with durationPattern it
// keeps every admitted value below the 2562047h an int64 of nanoseconds holds.
const maxDurationLength = 20

// CheckPrintable says whether s holds only printable characters, as the
// name and path rules require: valid UTF-8, no control, format,
// line-separator or private-use characters.
func CheckPrintable(s string) bool {
	return utf8.ValidString(s) && printablePattern().MatchString(s)
}

// CheckMountSourceInput returns the rules a mount source breaks beyond its
// form: climbing with '..' (~/../../etc would be /etc) and unprintable
// characters.
func CheckMountSourceInput(src string) []string {
	var out []string
	for _, s := range strings.Split(src, "/") {
		if s == ".." {
			out = append(out, MsgMountSourceDots)
			break
		}
	}
	if !CheckPrintable(src) {
		out = append(out, MsgMountSourceChars)
	}
	return out
}

// CheckBinaryPortable returns MsgBinaryPortable when a binary name leaves
// the portable filename set, or "".
func CheckBinaryPortable(name string) string {
	if !binaryPattern().MatchString(name) {
		return MsgBinaryPortable
	}
	return ""
}

// CheckDurationString returns MsgIdleTimeoutFormat when s is not a
// duration the admission rule admits, or "".
func CheckDurationString(s string) string {
	if len(s) > maxDurationLength || !durationPattern().MatchString(s) {
		return MsgIdleTimeoutFormat
	}
	return ""
}

// validateInput applies the rules of this file to a spec; ValidateSandboxSpec
// calls it.
func validateInput(spec *SandboxSpec, p *field.Path) field.ErrorList {
	errs := spec.UndecodedFields()
	mp := p.Child("mounts")
	for i, m := range spec.Mounts {
		for _, msg := range CheckMountSourceInput(m.Source) {
			errs = append(errs, field.Invalid(mp.Index(i).Child("source"), m.Source, msg))
		}
		if !CheckPrintable(m.Target) {
			errs = append(errs, field.Invalid(mp.Index(i).Child("target"), m.Target, MsgMountTargetChars))
		}
	}
	for i, b := range spec.Binaries {
		// The more specific rules (spaces, metacharacters, '/') speak first.
		if CheckBinaryName(string(b)) == "" {
			if msg := CheckBinaryPortable(string(b)); msg != "" {
				errs = append(errs, field.Invalid(p.Child("binaries").Index(i), b, msg))
			}
		}
	}
	if d := spec.IdleTimeout; d != nil && (d.Duration <= 0 || d.Duration > MaxIdleTimeout) {
		errs = append(errs, field.Invalid(p.Child("idleTimeout"), d.Duration.String(), MsgIdleTimeoutRange))
	}
	if c := spec.Containerd; c != nil {
		cp := p.Child("containerd")
		if c.PidsLimit != nil && (*c.PidsLimit < 1 || *c.PidsLimit > MaxPidsLimit) {
			errs = append(errs, field.Invalid(cp.Child("pidsLimit"), *c.PidsLimit, MsgPidsLimit))
		}
		errs = append(errs, positive(cp.Child("memoryLimit"), c.MemoryLimit, MsgMemoryPositive)...)
		if q := c.RootfsSizeLimit; q != nil && q.Cmp(minSizedFS) < 0 {
			errs = append(errs, field.Invalid(cp.Child("rootfsSizeLimit"), q.String(), MsgRootfsPositive))
		}
	}
	if in := spec.Incus; in != nil {
		errs = append(errs, positive(p.Child("incus", "rootSizeLimit"), in.RootSizeLimit, MsgRootPositive)...)
	}
	if r := spec.Resources; r != nil {
		errs = append(errs, validateResources(p.Child("resources"), r)...)
	}
	switch spec.RestartPolicy {
	case "", RestartWhenIdle, RestartImmediate:
	default:
		errs = append(errs, field.NotSupported(p.Child("restartPolicy"), spec.RestartPolicy,
			[]string{string(RestartWhenIdle), string(RestartImmediate)}))
	}
	return errs
}

// validateResources applies the rules of spec.resources (and of a class's
// defaultResources and maxResources).
func validateResources(p *field.Path, r *Resources) field.ErrorList {
	var errs field.ErrorList
	if r.PidsLimit != nil && (*r.PidsLimit < 1 || *r.PidsLimit > MaxPidsLimit) {
		errs = append(errs, field.Invalid(p.Child("pidsLimit"), *r.PidsLimit, MsgPidsLimit))
	}
	for _, a := range []struct {
		name string
		req  *resource.Quantity
		lim  *resource.Quantity
	}{{"cpu", r.Requests.CPU, r.Limits.CPU}, {"memory", r.Requests.Memory, r.Limits.Memory}} {
		errs = append(errs, positive(p.Child("requests", a.name), a.req, MsgResourcePositive)...)
		errs = append(errs, positive(p.Child("limits", a.name), a.lim, MsgResourcePositive)...)
		if a.req != nil && a.lim != nil && a.req.Cmp(*a.lim) > 0 {
			errs = append(errs, field.Invalid(p.Child("requests", a.name), a.req.String(), MsgRequestAboveLimit))
		}
	}
	return errs
}

// positive refuses a zero or negative limit: the runtimes read it as no
// limit at all.
// minSizedFS is the smallest size limit of a writable layer: below it no
// ext4 file system can be made to hold the layer (internal/sizedfs).
var minSizedFS = resource.MustParse("64Ki")

func positive(p *field.Path, q *resource.Quantity, msg string) field.ErrorList {
	if q != nil && q.Sign() <= 0 {
		return field.ErrorList{field.Invalid(p, q.String(), msg)}
	}
	return nil
}
