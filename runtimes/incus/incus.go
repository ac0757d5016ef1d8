// Package incus is the Incus sandbox driver: one persistent system
// container per agent, named cireilclaw-{agent}, driven over the Incus REST
// API on the daemon's unix socket. The agent's areas and custom mounts are
// disk devices of the container; the agent's own unprivileged host UID and
// GID (runtimes.Instance.Identity, never 0) are mapped into it to the same
// ids with raw.idmap, and commands run as that account in /workspace, so
// files the agent writes there belong to the agent's host identity. The
// controller's own identity is never mapped.
// Container-local state (installed packages, files outside the areas)
// persists across stop and start, because the driver stops instances and
// never deletes them except when asked to.
//
// The driver uses root inside the container only to set up the mapped
// account (through the file API, never by running a command as root). It
// never touches an instance it did not mark as its own, never removes or
// rewrites anything in the agent's areas, and reports a daemon it cannot
// reach as RuntimeUnavailable naming the socket, never as a panic or a
// failed constructor.
package incus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
)

// Instance configuration keys the driver records on every instance it
// makes. Incus keeps user.* keys as they are and never acts on them.
const (
	KeyOwner      = "user.cireilclaw.owner"
	KeyConfigHash = "user.cireilclaw.config-hash"
	KeyInstance   = "user.cireilclaw.instance"
	// KeyAccount marks a root in which the mapped account is set up, as
	// "uid:gid"; a rebuilt root loses it.
	KeyAccount = "user.cireilclaw.account"
)

// Defaults of Config.
const (
	DefaultStopTimeout = 30 * time.Second
	// AccountName is the name given to the mapped account when the image
	// has no account with its UID.
	AccountName = "agent"
)

// Remote is an image server an image reference may name, as in
// "images:debian/12".
type Remote struct {
	// Server is the server's URL.
	Server string
	// Protocol is "simplestreams" or "incus".
	Protocol string
}

// DefaultRemotes are the remotes the incus command knows out of the box.
var DefaultRemotes = map[string]Remote{
	"images": {Server: "https://images.linuxcontainers.org", Protocol: "simplestreams"},
}

// RawIdmap is the raw.idmap value that maps an agent's host identity into
// its container to the same ids, so that ownership reads the same on both
// sides of the areas.
func RawIdmap(id runtimes.Identity) string {
	if id.UID == id.GID {
		return fmt.Sprintf("both %d %d", id.UID, id.UID)
	}
	return fmt.Sprintf("uid %d %d\ngid %d %d", id.UID, id.UID, id.GID, id.GID)
}

// Hardening is the configuration every instance gets so that an agent has
// no more inside an Incus container than inside a containerd one: every
// process of the container, the agent's commands included, runs with
// no_new_privs (a setuid binary gains nothing) and an empty capability
// bounding set (root inside has no capability either), and cannot create
// user namespaces (in which it would hold every capability again: mount
// a tmpfs, configure a network namespace). Each instance gets a host id
// range of its own (security.idmap.isolated), so root of one container
// is nobody in another, even where two Sandboxes share a mount source.
// Setting up the mapped account needs none of it: the driver writes the
// account's files through the daemon's file API.
var Hardening = map[string]string{
	"raw.lxc":                 "lxc.no_new_privs = 1\nlxc.cap.keep = none\nlxc.sysctl.user.max_user_namespaces = 0\n",
	"security.idmap.isolated": "true",
	// A profile the Sandbox names may not make it privileged.
	"security.privileged": "false",
}

// limitsConfig is the instance configuration of r; an unset limit is ""
// (no limit), so that a limit removed from the Sandbox is lifted. A
// memory limit forbids swap beyond it (Incus writes a swap limit of 0
// where the kernel accounts swap): a process over it is killed, not
// swapped out.
func limitsConfig(r runtimes.Resources) map[string]string {
	out := map[string]string{"limits.memory": "", "limits.memory.swap": "", "limits.processes": "", "limits.cpu.allowance": ""}
	if r.MemoryBytes > 0 {
		out["limits.memory"] = strconv.FormatInt(r.MemoryBytes, 10)
		out["limits.memory.swap"] = "false"
	}
	if r.Pids > 0 {
		out["limits.processes"] = strconv.FormatInt(r.Pids, 10)
	}
	// A share of each 100 ms period, as a CFS quota: none for a limit
	// beyond the kernel's largest quota, which Incus would pass on to a
	// kernel that refuses it, and the instance would not start.
	if q := cgroup.CFSQuota(r.CPUMillis, cpuPeriod); q > 0 {
		out["limits.cpu.allowance"] = fmt.Sprintf("%dms/100ms", q/1000)
	}
	return out
}

// cpuPeriod is the CFS period (µs) of limits.cpu.allowance: 100 ms.
const cpuPeriod = 100000

// hardened says which of Hardening config lacks, for RestartRequired;
// "" when it has all of it.
func hardened(config map[string]string) string {
	var missing []string
	for k, v := range Hardening {
		if config[k] != v {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	slices.Sort(missing)
	return "hardening (" + strings.Join(missing, ", ") + ")"
}

// agentIdentity is the identity an instance's commands run as; host root
// (uid or gid 0) is refused: mapping it would make the agent root over
// every host file its mounts reach.
func agentIdentity(in runtimes.Instance) (runtimes.Identity, error) {
	if in.Identity.UID == 0 || in.Identity.GID == 0 {
		return runtimes.Identity{}, fmt.Errorf("the agent's host identity is uid %d gid %d: agent commands never run as host root (uid or gid 0), and host root is never mapped into a container",
			in.Identity.UID, in.Identity.GID)
	}
	return in.Identity, nil
}

// Config configures the driver.
type Config struct {
	// Socket is the daemon's unix socket; empty means DefaultSocket().
	Socket string
	// DefaultProject is the project of Sandboxes that name none; empty
	// means the caller's current project (CurrentProject), and failing
	// that the daemon's default project.
	DefaultProject string
	// Remotes are the image servers image references may name; nil means
	// DefaultRemotes.
	Remotes map[string]Remote
	// StopTimeout is how long a clean stop may take before the instance is
	// stopped by force; zero means DefaultStopTimeout.
	StopTimeout time.Duration
	// LookupEnv reads the controller's own environment for the locale and
	// the passthrough variables; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Client tunes the REST client's timeouts.
	Client incusapi.Options
	// HeldDir is where the driver binds each disk device's source from a
	// held directory (held.go): a directory only the controller writes,
	// in the daemon's mount namespace. Empty means DefaultHeldDir.
	HeldDir string
}

// DefaultSocket is the socket the incus command would use: INCUS_SOCKET,
// else unix.socket in INCUS_DIR, else incusapi.DefaultSocket.
func DefaultSocket() string {
	if s := os.Getenv("INCUS_SOCKET"); s != "" {
		return s
	}
	if d := os.Getenv("INCUS_DIR"); d != "" {
		return filepath.Join(d, "unix.socket")
	}
	return incusapi.DefaultSocket
}

// Runtime is the Incus driver.
type Runtime struct {
	cfg    Config
	client *incusapi.Client

	mu sync.Mutex
	// projects remembers which project each instance lives in: the
	// Runtime interface names instances, not projects.
	projects map[string]string
	// tcp remembers the TCP buffer limit written into each running
	// instance's cgroup, and for which start of it (limitTCP).
	tcp map[string]tcpMark
}

var (
	_ runtimes.Runtime = (*Runtime)(nil)
	_ runtimes.Pinger  = (*Runtime)(nil)
)

// New returns an Incus driver. It fails only on a configuration that can
// never work; a daemon that is down is reported by each call instead.
func New(cfg Config) (*Runtime, error) {
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket()
	}
	if !filepath.IsAbs(cfg.Socket) {
		return nil, fmt.Errorf("incus driver: socket path %q must be absolute", cfg.Socket)
	}
	if cfg.DefaultProject == "" {
		cfg.DefaultProject = CurrentProject()
	}
	if cfg.Remotes == nil {
		cfg.Remotes = DefaultRemotes
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.LookupEnv == nil {
		cfg.LookupEnv = os.LookupEnv
	}
	if cfg.HeldDir == "" {
		cfg.HeldDir = DefaultHeldDir
	}
	if !filepath.IsAbs(cfg.HeldDir) {
		return nil, fmt.Errorf("incus driver: held source directory %q must be an absolute path", cfg.HeldDir)
	}
	return &Runtime{cfg: cfg, client: incusapi.New(cfg.Socket, cfg.Client), projects: map[string]string{}}, nil
}

// Client is the driver's REST client (in the daemon's default project).
func (r *Runtime) Client() *incusapi.Client { return r.client }

// Close drops the driver's idle connections. Instances keep running.
func (r *Runtime) Close() { r.client.Close() }

// projectOf is the project an instance description asks for.
func (r *Runtime) projectOf(in runtimes.Instance) string {
	if in.Incus != nil && in.Incus.Project != "" {
		return in.Incus.Project
	}
	return r.cfg.DefaultProject
}

func (r *Runtime) remember(name, project string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.projects[name] = project
}

func (r *Runtime) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.projects, name)
	delete(r.tcp, name)
}

// locate finds an instance by name: in the project it was last seen in,
// else in any project, preferring one this driver made. A missing instance
// is (nil, nil).
func (r *Runtime) locate(ctx context.Context, name string) (*incusapi.Client, *incusapi.Instance, string, error) {
	r.mu.Lock()
	project, known := r.projects[name]
	r.mu.Unlock()
	if known {
		cl := r.client.InProject(project)
		inst, etag, err := cl.GetInstance(ctx, name)
		if err == nil {
			return cl, inst, etag, nil
		}
		if !incusapi.IsNotFound(err) {
			return nil, nil, "", err
		}
	}
	list, err := r.client.ListInstances(ctx, true)
	if err != nil {
		return nil, nil, "", err
	}
	var found *incusapi.Instance
	for i := range list {
		if list[i].Name != name {
			continue
		}
		if found == nil || (found.Config[KeyOwner] == "" && list[i].Config[KeyOwner] != "") {
			found = &list[i]
		}
	}
	if found == nil {
		if !known {
			return nil, nil, "", nil
		}
		r.forget(name)
		return nil, nil, "", nil
	}
	r.remember(name, found.Project)
	cl := r.client.InProject(found.Project)
	// The list carries no ETag; read the instance itself for one.
	inst, etag, err := cl.GetInstance(ctx, name)
	if incusapi.IsNotFound(err) {
		return nil, nil, "", nil
	}
	return cl, inst, etag, err
}

// fail wraps an error of the daemon with the reason the controller reports.
func (r *Runtime) fail(op, name string, err error) error {
	var re *runtimes.Error
	if errors.As(err, &re) {
		return err
	}
	var se *incusapi.StatusError
	switch {
	case incusapi.IsUnavailable(err):
		return &runtimes.Error{Reason: runtimes.ReasonUnavailable, Op: op, Name: name,
			Err: fmt.Errorf("%w (the runtime user must be able to open the Incus socket %s)", err, r.cfg.Socket)}
	case errors.As(err, &se) && se.Code == 503:
		return &runtimes.Error{Reason: runtimes.ReasonUnavailable, Op: op, Name: name, Err: err}
	case incusapi.IsNotFound(err):
		return &runtimes.Error{Reason: runtimes.ReasonNotFound, Op: op, Name: name, Err: err}
	default:
		return &runtimes.Error{Reason: runtimes.ReasonFailed, Op: op, Name: name, Err: err}
	}
}

// restricted turns the daemon's refusals of a restricted project into
// errors that say what the project must permit; other errors are nil.
func (r *Runtime) restricted(op string, in runtimes.Instance, project string, err error) error {
	msg := err.Error()
	if project == "" {
		project = "default"
	}
	id := in.Identity
	switch {
	case strings.Contains(msg, "raw.idmap") && strings.Contains(msg, "forbidden"):
		return runtimes.Errorf(runtimes.ReasonIdmapNotPermitted, op, in.Name,
			"Incus project %q is restricted and does not permit raw.idmap for the agent's host UID %d and GID %d; "+
				"the project must permit the controller's agent id range: incus project set %s restricted.idmap.uid=%d restricted.idmap.gid=%d (daemon said: %v)",
			project, id.UID, id.GID, project, id.UID, id.GID, err)
	case (strings.Contains(msg, "raw.lxc") || strings.Contains(msg, "low-level config")) && strings.Contains(msg, "forbidden"):
		// The daemon names the first low-level key it meets, in no set
		// order: raw.lxc, or limits.memory.swap, which every instance has
		// too. One setting permits them all.
		return runtimes.Errorf(runtimes.ReasonHardeningNotPermitted, op, in.Name,
			"Incus project %q is restricted and does not permit the low-level configuration every instance is given "+
				"(raw.lxc: no_new_privs, no capabilities, no user namespaces; limits.memory.swap); the project must permit it: incus project set %s restricted.containers.lowlevel=allow (daemon said: %v)",
			project, project, err)
	case strings.Contains(msg, "disks not backed by a pool is forbidden") ||
		(strings.Contains(msg, "Disk source path") && strings.Contains(msg, "not allowed")):
		return runtimes.Errorf(runtimes.ReasonHostDisksNotPermitted, op, in.Name,
			"Incus project %q is restricted and does not permit disk devices backed by host paths, which the agent's areas and mounts are "+
				"(each bound from a held directory below %s); the project must permit them: incus project set %s restricted.devices.disk=allow restricted.devices.disk.paths=%s (daemon said: %v)",
			project, r.cfg.HeldDir, project, r.cfg.HeldDir, err)
	case strings.Contains(msg, "idmap") && (strings.Contains(msg, "not allowed") || strings.Contains(msg, "subuid") || strings.Contains(msg, "subgid")):
		return notDelegated(op, in, fmt.Sprintf("daemon said: %v", err))
	}
	return nil
}

// notDelegated says that the server may not map the agent's ids, and how an
// administrator lets it.
func notDelegated(op string, in runtimes.Instance, said string) error {
	return runtimes.Errorf(runtimes.ReasonIdmapNotPermitted, op, in.Name,
		"the Incus server may not map the agent's host UID %d and GID %d into containers; "+
			"root must be allowed to delegate the controller's agent id range: add it to root's entries in /etc/subuid and /etc/subgid, "+
			"in pieces smaller than 65536 so Incus never takes it for the base map of its containers (hack/incus.sh does), and restart incusd (%s)",
		in.Identity.UID, in.Identity.GID, said)
}

// startRefusal reads why a start failed from the instance's LXC log: a
// container whose raw.idmap names ids root may not delegate fails in
// newuidmap or newgidmap; a disk device whose destination's path inside
// the container holds a symbolic link (the agent replaced a directory of
// /workspace/<target>) is refused by LXC, which opens each component
// without following links. The daemon's own answer says only that
// forkstart exited. It is nil when the log says nothing known.
func startRefusal(op string, in runtimes.Instance, log string) error {
	for _, line := range strings.Split(log, "\n") {
		if (strings.Contains(line, "newuidmap") || strings.Contains(line, "newgidmap")) && strings.Contains(line, "not allowed") {
			return notDelegated(op, in, "LXC said: "+strings.TrimSpace(line))
		}
		if strings.Contains(line, "was a symbolic link") {
			return runtimes.Errorf(runtimes.ReasonFailed, op, in.Name,
				"a mount destination's path inside the container is a symbolic link (placed there from inside the sandbox?); it is not followed, "+
					"and the instance cannot start until it is removed from the host side (LXC said: %s)", strings.TrimSpace(line))
		}
	}
	return nil
}
