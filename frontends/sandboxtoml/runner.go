package sandboxtoml

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Source gives the configuration in force; a *Watcher is one.
type Source interface {
	Current() Snapshot
}

// Static is a Source that never changes: one command, one file read.
type Static struct{ Spec *v1alpha1.SandboxSpec }

// Current returns the one configuration.
func (s Static) Current() Snapshot { return Snapshot{Spec: s.Spec, Generation: 1} }

// Runner runs commands in the sandbox a Source describes. Each command takes
// the snapshot current when it starts and runs with that whole
// configuration; a reload reaches the next command, never one already
// running and never half of one.
type Runner struct {
	// Networks, when set, makes and serves the network namespace and
	// proxy of a configuration whose egress is an allowlist, while the
	// runner runs (its Dir is the Host's NetnsDir); nil: such a
	// configuration is refused.
	Networks *egress.Networks
	// Guard lists host paths the sandbox must have no writable view of:
	// the configuration file and the state that records the instance. A
	// configuration with a read-write mount or area that holds one of
	// them is refused: the agent would rewrite what it may do, and the
	// next command (or reload) would take it.
	Guard []string

	src     Source
	rt      runtimes.Runtime
	backend v1alpha1.Backend
	opts    instance.Host

	mu sync.Mutex
	// applied is the generation the runtime was last ensured with.
	applied int64
	name    string
	// standalone says that the instance last ensured can be left as it
	// is: no custom mount, no egress proxy.
	standalone bool
	// proxied is the instance whose egress proxy the runner serves; ""
	// for none.
	proxied string
}

// NewRunner runs commands from src with rt, a driver for backend. opts say
// where the agent areas are and how ~/ expands.
func NewRunner(src Source, rt runtimes.Runtime, backend v1alpha1.Backend, opts instance.Host) *Runner {
	return &Runner{src: src, rt: rt, backend: backend, opts: opts}
}

// Exec runs one command with the current configuration.
func (r *Runner) Exec(ctx context.Context, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	name, err := r.ensure(ctx)
	if err != nil {
		return runtimes.ExitStatus{}, err
	}
	return r.rt.Exec(ctx, name, req)
}

// ensure brings the runtime to the current snapshot when it is newer than
// the one applied. The driver records the instance atomically, so a command
// starting concurrently sees either the old or the new configuration.
func (r *Runner) ensure(ctx context.Context) (string, error) {
	snap := r.src.Current()
	r.mu.Lock()
	defer r.mu.Unlock()
	if snap.Generation <= r.applied {
		return r.name, nil
	}
	if b := snap.Spec.BackendOrDefault(); b != r.backend {
		return "", fmt.Errorf("running a command for agent %s: the configuration selects backend %s, but this runner drives %s; convert the file to a Sandbox manifest for a controller with that backend", snap.Spec.Agent, b, r.backend)
	}
	in, err := instance.Standalone(snap.Spec, r.opts)
	if err != nil {
		return "", fmt.Errorf("describing the sandbox of agent %s (configuration generation %d): %w", snap.Spec.Agent, snap.Generation, err)
	}
	if err := checkGuard(in, r.Guard); err != nil {
		return "", fmt.Errorf("the sandbox of agent %s (configuration generation %d): %w", snap.Spec.Agent, snap.Generation, err)
	}
	if err := r.serveNetwork(in); err != nil {
		return "", fmt.Errorf("the egress proxy of agent %s: %w", snap.Spec.Agent, err)
	}
	if _, err := r.rt.Ensure(ctx, in); err != nil {
		return "", fmt.Errorf("preparing the sandbox of agent %s (configuration generation %d): %w", snap.Spec.Agent, snap.Generation, err)
	}
	r.applied, r.name = snap.Generation, in.Name
	r.standalone = in.Network == nil && len(in.Mounts) == 0
	return r.name, nil
}

// checkGuard refuses an instance with a writable area or mount (read-write;
// an overlay's writes stay in its upper layer) whose source is one of the
// guarded paths or a directory above one. Sources are compared as the
// driver resolves them, by the held directory's device and inode; one that
// cannot be resolved is the driver's to report.
func checkGuard(in runtimes.Instance, guard []string) error {
	type held struct {
		path string
		fi   os.FileInfo
	}
	var above []held
	for _, g := range guard {
		for p := g; ; p = filepath.Dir(p) {
			if fi, err := os.Stat(p); err == nil {
				above = append(above, held{g, fi})
			}
			if p == filepath.Dir(p) {
				break
			}
		}
	}
	for _, w := range in.WritableSources() {
		for _, h := range above {
			if os.SameFile(w.Dir, h.fi) {
				return fmt.Errorf("%s, writable in the sandbox at %s, holds %s: the sandbox could change what it may do; mount it read-only or as an overlay, or keep %s outside it", w.Bind.Source, w.Bind.Target, h.path, h.path)
			}
		}
	}
	return nil
}

// serveNetwork serves the egress proxy of an instance whose egress is an
// allowlist, and releases the one served for an earlier configuration
// that no longer wants it: left serving, it would take a command that
// names it (HTTPS_PROXY set by hand) to the old list.
func (r *Runner) serveNetwork(in runtimes.Instance) error {
	if r.Networks == nil {
		return nil
	}
	if r.proxied != "" && (in.Network == nil || r.proxied != in.Name) {
		if err := r.Networks.Release(r.proxied); err != nil {
			return fmt.Errorf("releasing it: %w", err)
		}
		r.proxied = ""
	}
	if in.Network == nil {
		return nil
	}
	pol, err := instance.EgressPolicy(in.Network)
	if err != nil {
		return err
	}
	// One machine's user is its only tenant.
	if _, err := r.Networks.Serve(in.Name, "", pol); err != nil {
		return fmt.Errorf("serving it: %w", err)
	}
	r.proxied = in.Name
	return nil
}

// Leave ends the runner of one command (sandboxctl run). An instance
// without custom mounts or an egress proxy is left as it is, its mount
// tree (the standard areas' binds) and cgroup kept for the next command,
// which verifies them as the controller does and rebuilds only what
// changed: a command's start then costs a check instead of building and
// removing a tree. Its processes ended with the command (bubblewrap's own
// pid namespace). Any other is stopped, as Close does: an egress proxy
// lives only with this process, an overlay's mount is kept in step with
// its configuration, and a custom mount's tree would make directories of
// the agent's workspace mount points, which could not be removed while a
// kept tree holds them.
func (r *Runner) Leave(ctx context.Context) error {
	r.mu.Lock()
	keep := r.standalone
	r.mu.Unlock()
	if keep {
		return nil
	}
	return r.Close(ctx)
}

// Close stops the instance the runner ensured, so nothing it set up (an
// overlay mount, say) outlives the runner. The agent's areas and an
// overlay's unapplied changes stay.
func (r *Runner) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.name != "" {
		err = r.rt.Stop(ctx, r.name)
		if r.Networks != nil {
			err = errors.Join(err, r.Networks.Release(r.name))
		}
	}
	// A proxy served for a configuration whose instance never started.
	if r.proxied != "" && r.proxied != r.name {
		err = errors.Join(err, r.Networks.Release(r.proxied))
	}
	r.applied, r.name, r.proxied = 0, "", ""
	return err
}
