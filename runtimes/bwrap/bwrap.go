// Package bwrap is the default sandbox driver: there is no long-lived
// instance, each command runs in a fresh bubblewrap namespace set built from
// the instance description. "Running" is a recorded state (a file per
// instance in the state directory) so that a restarted controller adopts it;
// Stop and Delete end the commands still running. The driver never removes
// or rewrites anything in the agent's areas.
package bwrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// TmpSize is the size of the fresh /tmp every command gets (64 MiB).
const TmpSize = 64 << 20

// HostPath is where allowed binaries are looked up on the host, and the PATH
// commands see inside the sandbox.
const HostPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

// Config configures the driver.
type Config struct {
	// StateDir records one file per instance. It must not be inside an area.
	StateDir string
	// Bwrap is the bubblewrap executable; empty means "bwrap" on PATH.
	Bwrap string
}

// Runtime is the bwrap driver.
type Runtime struct {
	stateDir string
	bwrap    string

	mu      sync.Mutex
	running map[string]map[*exec.Cmd]struct{}
}

var _ runtimes.Runtime = (*Runtime)(nil)

// New returns a bwrap driver. It does not fail when bwrap is missing: that is
// reported as RuntimeUnavailable by Ensure, so a Sandbox says why.
func New(cfg Config) (*Runtime, error) {
	if !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("bwrap state directory %q must be an absolute path", cfg.StateDir)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating bwrap state directory: %w", err)
	}
	b := cfg.Bwrap
	if b == "" {
		b = "bwrap"
	}
	return &Runtime{stateDir: cfg.StateDir, bwrap: b, running: map[string]map[*exec.Cmd]struct{}{}}, nil
}

// record is the state file of one instance.
type record struct {
	Instance   runtimes.Instance `json:"instance"`
	Owner      string            `json:"owner"`
	ConfigHash string            `json:"configHash"`
	Running    bool              `json:"running"`
	CreatedAt  time.Time         `json:"createdAt"`
}

func (r *Runtime) statePath(name string) string {
	return filepath.Join(r.stateDir, name+".json")
}

func (r *Runtime) load(name string) (*record, error) {
	b, err := os.ReadFile(r.statePath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, runtimes.Errorf(runtimes.ReasonUnavailable, "reading state of", name, "%w", err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, runtimes.Errorf(runtimes.ReasonFailed, "reading state of", name, "%s is corrupt: %w", r.statePath(name), err)
	}
	return &rec, nil
}

func (r *Runtime) save(rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(r.stateDir, ".state-*")
	if err != nil {
		return runtimes.Errorf(runtimes.ReasonUnavailable, "recording state of", rec.Instance.Name, "%w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return runtimes.Errorf(runtimes.ReasonUnavailable, "recording state of", rec.Instance.Name, "%w", err)
	}
	if err := tmp.Close(); err != nil {
		return runtimes.Errorf(runtimes.ReasonUnavailable, "recording state of", rec.Instance.Name, "%w", err)
	}
	if err := os.Rename(tmp.Name(), r.statePath(rec.Instance.Name)); err != nil {
		return runtimes.Errorf(runtimes.ReasonUnavailable, "recording state of", rec.Instance.Name, "%w", err)
	}
	return nil
}

func (rec *record) state() runtimes.State {
	return runtimes.State{
		Name: rec.Instance.Name, Exists: true, Running: rec.Running,
		Owner: rec.Owner, ConfigHash: rec.ConfigHash, CreatedAt: rec.CreatedAt,
	}
}

// Ensure lays out the agent's areas and records the instance as running.
func (r *Runtime) Ensure(_ context.Context, in runtimes.Instance) (runtimes.State, error) {
	if _, err := exec.LookPath(r.bwrap); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonUnavailable, "ensuring", in.Name,
			"bubblewrap (%s) is not installed or not on PATH: install the bubblewrap package", r.bwrap)
	}
	rec, err := r.load(in.Name)
	if err != nil {
		return runtimes.State{}, err
	}
	if rec != nil && rec.Owner != in.Owner {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonNameConflict, "ensuring", in.Name,
			"the instance belongs to Sandbox %s", rec.Owner)
	}
	names := make([]string, 0, len(in.Areas))
	for _, a := range in.Areas {
		names = append(names, filepath.Base(a.Source))
	}
	if err := areas.Layout(in.AgentDir, names); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, "ensuring", in.Name, "%w", err)
	}
	if rec == nil {
		rec = &record{CreatedAt: time.Now().UTC().Truncate(time.Second), Owner: in.Owner}
	}
	if rec.Running && rec.ConfigHash == in.ConfigHash {
		return rec.state(), nil
	}
	rec.Instance, rec.ConfigHash, rec.Running = in, in.ConfigHash, true
	if err := r.save(rec); err != nil {
		return runtimes.State{}, err
	}
	return rec.state(), nil
}

// Stop records the instance as stopped and ends its running commands.
func (r *Runtime) Stop(_ context.Context, name string) error {
	rec, err := r.load(name)
	if err != nil || rec == nil {
		return err
	}
	r.killAll(name)
	if !rec.Running {
		return nil
	}
	rec.Running = false
	return r.save(rec)
}

// Delete ends the instance's commands and forgets it. The areas stay.
func (r *Runtime) Delete(_ context.Context, name string) error {
	r.killAll(name)
	if err := os.Remove(r.statePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return runtimes.Errorf(runtimes.ReasonUnavailable, "deleting", name, "%w", err)
	}
	return nil
}

// Inspect reports the recorded state.
func (r *Runtime) Inspect(_ context.Context, name string) (runtimes.State, error) {
	rec, err := r.load(name)
	if err != nil || rec == nil {
		return runtimes.State{Name: name}, err
	}
	return rec.state(), nil
}

// List reports every recorded instance.
func (r *Runtime) List(_ context.Context) ([]runtimes.State, error) {
	entries, err := os.ReadDir(r.stateDir)
	if err != nil {
		return nil, runtimes.Errorf(runtimes.ReasonUnavailable, "listing", r.stateDir, "%w", err)
	}
	var out []runtimes.State
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		rec, err := r.load(name)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			out = append(out, rec.state())
		}
	}
	return out, nil
}

// Exec runs one allowed command in a fresh namespace set.
func (r *Runtime) Exec(ctx context.Context, name string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	rec, err := r.load(name)
	if err != nil {
		return runtimes.ExitStatus{}, err
	}
	if rec == nil || !rec.Running {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonNotFound, "running a command in", name, "the instance is not running")
	}
	if err := policy.CheckArgv(rec.Instance.Binaries, req.Argv); err != nil {
		return runtimes.ExitStatus{}, &runtimes.Error{Reason: runtimes.ReasonRefused, Op: "running a command in", Name: name, Err: err}
	}
	bin, err := lookHost(req.Argv[0])
	if err != nil {
		return runtimes.ExitStatus{}, &runtimes.Error{Reason: runtimes.ReasonRefused, Op: "running a command in", Name: name, Err: err}
	}
	args := Args(rec.Instance, bin, req.Env)
	args = append(args, req.Argv[1:]...)

	cmd := exec.CommandContext(ctx, r.bwrap, args...)
	cmd.Env = []string{}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	// bwrap's --die-with-parent ends the sandbox if we die; its own process
	// group lets Stop end it and anything it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

	r.track(name, cmd)
	defer r.untrack(name, cmd)
	err = cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return runtimes.ExitStatus{Code: 0}, nil
	case errors.As(err, &exitErr):
		code := exitErr.ExitCode()
		if code < 0 {
			code = 128 + int(exitErr.Sys().(syscall.WaitStatus).Signal())
		}
		return runtimes.ExitStatus{Code: code}, nil
	default:
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonUnavailable, "running a command in", name, "starting bwrap: %w", err)
	}
}

func (r *Runtime) track(name string, cmd *exec.Cmd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.running[name]
	if set == nil {
		set = map[*exec.Cmd]struct{}{}
		r.running[name] = set
	}
	set[cmd] = struct{}{}
}

func (r *Runtime) untrack(name string, cmd *exec.Cmd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running[name], cmd)
}

func (r *Runtime) killAll(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for cmd := range r.running[name] {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
}

// lookHost finds an allowed command on the host's system PATH.
func lookHost(name string) (string, error) {
	for _, dir := range filepath.SplitList(HostPath) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q is allowed but not installed on the host (looked in %s)", name, HostPath)
}

// systemDirs are exposed read-only so allowed commands and their libraries
// run; a merged-/usr host has symbolic links for some of them.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// hostFiles are the account files, certificates and loader configuration
// the seed exposes read-only.
var hostFiles = []string{
	"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts",
	"/etc/localtime", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
	"/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/alternatives",
}

// Args builds the bwrap argument list for one command: everything up to and
// including the command path. The caller appends the command's arguments.
func Args(in runtimes.Instance, bin string, env []string) []string {
	a := []string{
		"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
	}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&fs.ModeSymlink != 0:
			if t, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", t, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	for _, f := range hostFiles {
		a = append(a, "--ro-bind-try", f, f)
	}
	if !underSystemDir(bin) {
		a = append(a, "--ro-bind", bin, bin)
	}
	a = append(a, "--proc", "/proc")
	switch {
	case in.Devices.All:
		a = append(a, "--dev-bind", "/dev", "/dev")
	case in.Devices.USB:
		a = append(a, "--dev", "/dev", "--dev-bind-try", "/dev/bus/usb", "/dev/bus/usb")
	default:
		a = append(a, "--dev", "/dev")
	}
	a = append(a, "--size", fmt.Sprint(TmpSize), "--tmpfs", "/tmp")
	for _, b := range in.Areas {
		a = append(a, bindFlag(b.ReadOnly), b.Source, b.Target)
	}
	for _, m := range in.Mounts {
		a = append(a, bindFlag(m.ReadOnly), m.Source, m.Target)
	}
	a = append(a, "--remount-ro", "/", "--chdir", "/workspace", "--clearenv")
	a = append(a, "--setenv", "HOME", "/workspace", "--setenv", "PATH", HostPath)
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" {
			a = append(a, "--setenv", k, v)
		}
	}
	return append(a, "--", bin)
}

func bindFlag(ro bool) string {
	if ro {
		return "--ro-bind"
	}
	return "--bind"
}

func underSystemDir(p string) bool {
	return slices.ContainsFunc(systemDirs, func(d string) bool { return strings.HasPrefix(p, d+"/") })
}
