// Package runtimes defines what every sandbox driver does (the Runtime
// interface) and the one description of an instance that drivers take
// (Instance). Drivers never read the API types: Describe builds the Instance
// from a SandboxSpec, so the sandbox.toml path and the cluster path share
// every rule.
package runtimes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Runtime is a sandbox driver. Every method is idempotent and safe to repeat
// after a crash at any point; none of them ever touches the host areas.
type Runtime interface {
	// Ensure creates the instance if it is absent and starts it if it is
	// stopped. A running instance with the same ConfigHash is left alone.
	Ensure(ctx context.Context, in Instance) (State, error)
	// Stop stops the instance and keeps its container-local state.
	Stop(ctx context.Context, name string) error
	// Delete removes the instance. Host areas are never touched.
	Delete(ctx context.Context, name string) error
	// Inspect reports the instance; an absent instance is State{Exists: false}.
	Inspect(ctx context.Context, name string) (State, error)
	// Exec runs one command in the instance and returns its exit status.
	Exec(ctx context.Context, name string, req ExecRequest) (ExitStatus, error)
	// List reports the instances this driver owns, for orphan collection.
	List(ctx context.Context) ([]State, error)
}

// NetnsReporter is a driver whose instances may keep a network namespace of
// their own (Incus's containers, owned by their user namespace), in which
// the controller serves an egress proxy rather than giving them one.
type NetnsReporter interface {
	// OwnNetwork says whether the instances keep their own namespace.
	OwnNetwork() bool
	// NetworkNamespace opens the running instance's network namespace
	// (that of its init), checked to be the init's when opened: a pid
	// read from the runtime and opened by path later could be another
	// process's by then. The caller closes it.
	NetworkNamespace(ctx context.Context, name string) (*os.File, error)
}

// State is what a driver observed of one instance.
type State struct {
	Name    string
	Exists  bool
	Running bool
	// Owner is the <namespace>/<name> of the Sandbox that made the instance.
	Owner string
	// ConfigHash is the Instance.ConfigHash the instance was last ensured with.
	ConfigHash string
	// CreatedAt is when the instance was first created; adoption keeps it.
	CreatedAt time.Time
	// RestartRequired, when not empty, says which change the running
	// instance could not take live; it applies on the next stop and start.
	RestartRequired string
	// Overlay is the health of the instance's writable root; nil for
	// drivers without one.
	Overlay *Health
}

// Health is how a driver found an instance's storage: Reason is one of
// ReasonHealthy, ReasonSnapshotMissing, ReasonNotMounted,
// ReasonUpperDirOverLimit.
type Health struct {
	Healthy bool
	Reason  Reason
	Message string
}

// ExecRequest is one command. Argv is passed as separate arguments, never
// through a shell.
type ExecRequest struct {
	Argv   []string
	Env    []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Usage is what an instance's commands use now, from its cgroup.
type Usage struct {
	// MemoryBytes counts what is in swap too, where the kernel accounts it.
	MemoryBytes int64
	Pids        int64
	CPUSeconds  float64
	// OOMKills counts processes the memory limit killed, PidsLimited the
	// forks the pids limit refused, since the instance started.
	OOMKills    int64
	PidsLimited int64
}

// Pinger is a Runtime that works through a daemon of its own, which can go
// away while its instances run on (containerd's tasks keep their shims,
// Incus's containers their monitors). Ping says whether the daemon
// answers, and costs one round trip.
type Pinger interface {
	Ping(ctx context.Context) error
}

// UsageReader is a Runtime that can say what an instance uses.
type UsageReader interface {
	Usage(name string) (Usage, error)
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	Code int
}

// Reason is what a driver says about an instance: why an operation failed
// (Error) or how its storage is (Health). It is the driver's word, not a
// condition reason: the controller maps each Reason to the API's condition
// reason (bridge/instance/reasons.go), and a test there fails for a Reason
// without one, so that every reason string is written once, in the API.
type Reason int

const (
	// ReasonFailed: the runtime refused an operation; the message says which.
	ReasonFailed Reason = iota
	// ReasonUnavailable: the runtime's daemon or tool cannot be reached.
	ReasonUnavailable
	// ReasonNameConflict: the instance exists and another owner made it.
	ReasonNameConflict
	// ReasonImageNotFound: the image is not present where the runtime looks.
	ReasonImageNotFound
	// ReasonNotFound: the instance does not exist or is not running.
	ReasonNotFound
	// ReasonRefused: the policy or the runtime refused the command or the
	// instance description; nothing ran.
	ReasonRefused
	// ReasonMountSourceMissing: a custom mount's host source is missing,
	// not a directory, or a symbolic-link loop (CheckMountSources).
	ReasonMountSourceMissing
	// ReasonIdmapNotPermitted: the Incus project or server forbids the
	// raw.idmap entry that maps the agent's host UID and GID into the
	// container.
	ReasonIdmapNotPermitted
	// ReasonHostDisksNotPermitted: the Incus project forbids disk devices
	// backed by host paths, which the areas and mounts are.
	ReasonHostDisksNotPermitted
	// ReasonHardeningNotPermitted: the Incus project forbids the low-level
	// configuration (raw.lxc) the driver hardens every instance with.
	ReasonHardeningNotPermitted
	// ReasonLimitsUnavailable: the instance's resource limits cannot be
	// enforced (no cgroup can be made).
	ReasonLimitsUnavailable

	// ReasonHealthy: the writable root and the overlay mounts are present,
	// mounted and within their limits.
	ReasonHealthy
	// ReasonSnapshotMissing: a container's snapshot or an upper layer is gone.
	ReasonSnapshotMissing
	// ReasonNotMounted: a writable root or an overlay mount is not mounted,
	// or a lower layer is missing.
	ReasonNotMounted
	// ReasonUpperDirOverLimit: a writable layer exceeds its size limit.
	ReasonUpperDirOverLimit
	// ReasonSizeLimitNotEnforced: the storage of a writable layer cannot
	// hold it to its size limit.
	ReasonSizeLimitNotEnforced

	reasonCount
)

// Reasons lists every Reason, for the table that maps them.
func Reasons() []Reason {
	out := make([]Reason, 0, reasonCount)
	for r := range reasonCount {
		out = append(out, r)
	}
	return out
}

// Error is a runtime failure with the reason it maps to.
type Error struct {
	Reason Reason
	Op     string
	Name   string
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Op, e.Name, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error.
func Errorf(reason Reason, op, name, format string, args ...any) error {
	return &Error{Reason: reason, Op: op, Name: name, Err: fmt.Errorf(format, args...)}
}

// ReasonOf returns the reason carried by err, or ReasonFailed.
func ReasonOf(err error) Reason {
	var re *Error
	if errors.As(err, &re) {
		return re.Reason
	}
	return ReasonFailed
}

// OutputWriters returns the writers a driver copies a command's stdout and
// stderr into. When the caller gave one writer for both (as
// exec.Cmd.CombinedOutput does), the two copies would write to it at once;
// like os/exec, both then go through one lock, so no write is lost.
func OutputWriters(stdout, stderr io.Writer) (io.Writer, io.Writer) {
	if stdout == nil || stderr == nil || !sameWriter(stdout, stderr) {
		return stdout, stderr
	}
	l := &lockedWriter{w: stdout}
	return l, l
}

// sameWriter compares two writers that may not be comparable values.
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
