// Package bwrap is the default sandbox driver: there is no long-lived
// instance, each command runs in a fresh bubblewrap namespace set built from
// the instance description. "Running" is a recorded state (a file per
// instance in the state directory) so that a restarted controller adopts it;
// Stop and Delete end the commands still running. The driver never removes
// or rewrites anything in the agent's areas.
package bwrap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/fdfile"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/internal/startns"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/runtimes/mounttree"
)

// DefaultTreesDir is where mount trees live by default: below /run, so that
// every agent id can search the path to them, in a tmpfs mounted there
// (mounttree.MakeTreesMount), so that they go with a reboot like the
// mounts in them, even where /run is on disk.
const DefaultTreesDir = "/run/sandbox-controller/trees"

// OutputDrain is how long a command's output may keep arriving after the
// command exited, from something it left behind, before it is cut off.
const OutputDrain = 5 * time.Second

// TmpSize is the size of the fresh /tmp every command gets (64 MiB).
const TmpSize = 64 << 20

// Config configures the driver.
type Config struct {
	// StateDir records one file per instance. It must not be inside an area.
	StateDir string
	// Bwrap is the bubblewrap executable; empty means "bwrap" on PATH.
	Bwrap string
	// LookupEnv reads the runtime's own environment: the locale, the values
	// of passthrough variables and the switch that disables the sandbox.
	// Nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Warnings receives the warning printed before every command that runs
	// without the sandbox. Nil means os.Stderr.
	Warnings io.Writer
	// TreesDir holds the instances' mount trees (areas and custom mounts
	// bound where agents cannot change them). Agents' ids must be able to
	// search every directory above it. Its parent is made an unbindable
	// mount, so nothing may be bound from below it: it must hold nothing
	// but mount trees. Empty means a directory of DefaultTreesDir named
	// after StateDir.
	TreesDir string
	// Host describes the host's file system; zero fields mean the real
	// host's. Tests point it at synthetic layouts.
	Host Host
	// CgroupParent is the cgroup (a path from the root of each hierarchy)
	// the instances' cgroups are made below; empty means below the
	// driver's own cgroup. Each instance gets a cgroup with its limits
	// (Instance.Resources) and every command starts inside it.
	CgroupParent string
	// AllowUnlimited lets instances run without a cgroup where none can be
	// made (no cgroup controllers, no permission), with a warning on every
	// Ensure. Without it such an instance is refused (LimitsUnavailable).
	AllowUnlimited bool
	// ContainerBundles is the node runtime's directory of its containers'
	// bundles, each holding the container's root file system at
	// <id>/rootfs (containerd's <state>/io.containerd.runtime.v2.task/k8s.io
	// for the kubelet's containers), as this process sees it. An instance
	// with an Image sees the root file system of its Pod's container.
	// Empty: instances with an Image are refused.
	ContainerBundles string
	// JoinCgroupToStart is for a process whose one job is the command it
	// starts (sandboxctl run): on cgroup v1 the thread starting a command
	// joins the instance's cgroups for the fork and leaves at once
	// (cgroup.Manager.JoinToStart), 5 to 15 ms faster a start. Never for
	// the controller: for that instant it is one of the instance's
	// processes.
	JoinCgroupToStart bool
	// Starter is the cgroup v1 starter (cmd/sandbox-holder) commands
	// may start through (cgroup.Manager.Starter, and CgroupV1Start): 5 to
	// 15 ms faster a start than stopping the command and moving it in on
	// hosts where a move waits for the kernel, without this process ever
	// joining an instance's cgroups. Empty: the sandbox-holder beside
	// this executable, when it is there and only root may change it;
	// otherwise commands are stopped at their start and moved in. Unused
	// on cgroup v2 and with JoinCgroupToStart.
	Starter string
	// CgroupV1Start chooses between the starter and moving stopped
	// commands in, on cgroup v1: StartAuto (or empty) measures both at
	// New, once a process (cgroup.MeasureStarts, about 0.1 s), and takes
	// the starter unless moving commands in is the faster here;
	// StartStarter always takes the starter (when there is one);
	// StartMove always moves commands in.
	CgroupV1Start string
}

// The values of Config.CgroupV1Start.
const (
	StartAuto    = "auto"
	StartStarter = "starter"
	StartMove    = "move"
)

// Host is where the driver finds things on the host.
type Host struct {
	// SearchPath lists the directories allowed commands are looked up in,
	// in order. Empty means the minimal PATH followed by the NixOS system
	// profile.
	SearchPath []string
	// NixStore is the Nix store; empty means /nix/store. Allowed commands
	// that resolve into it get their store requisites bound read-only.
	NixStore string
	// NixStoreQuery is the nix-store command used to list requisites;
	// empty means nix-store on the search path. When there is none the
	// requisites are read from ELF interpreters, RPATH/RUNPATH and script
	// interpreter lines.
	NixStoreQuery string
	// USBDevices is the host's USB device directory; empty means
	// /dev/bus/usb.
	USBDevices string
}

func (h Host) withDefaults() Host {
	if len(h.SearchPath) == 0 {
		h.SearchPath = append(filepath.SplitList(policy.MinimalPath), nixSystemProfile)
	}
	if h.NixStore == "" {
		h.NixStore = "/nix/store"
	}
	h.NixStore = filepath.Clean(h.NixStore)
	if h.USBDevices == "" {
		h.USBDevices = "/dev/bus/usb"
	}
	return h
}

// nixSystemProfile is where NixOS puts the system's commands.
const nixSystemProfile = "/run/current-system/sw/bin"

// Runtime is the bwrap driver.
type Runtime struct {
	stateDir string
	bwrap    string
	// bwrapFound is where bwrap was last found on PATH (bubblewrap).
	bwrapFound atomic.Pointer[string]
	lookupEnv  func(string) (string, bool)
	warnings   io.Writer
	host       Host

	// trees holds each instance's workspace mount tree (mounttree), in a
	// private mount of its own; empty when the driver is not root and
	// binds custom mounts by path (it then runs as the agent itself).
	trees string

	mu      sync.Mutex
	running map[string]map[*command]struct{}
	// treeLocks serialises building an instance's tree.
	treeLocks map[string]*sync.Mutex
	// closures caches the Nix store requisites of a resolved command. Store
	// paths are immutable, so an entry never goes stale.
	closures map[string][]string

	// cgroups makes each instance's cgroup; nil when none can be made,
	// and cgroupErr then says why.
	cgroups        *cgroup.Manager
	cgroupErr      error
	allowUnlimited bool
	// joinToStart: commands start on a goroutine of their own
	// (Config.JoinCgroupToStart).
	joinToStart bool
	// starter is the cgroup v1 starter (Config.Starter); "" for none.
	starter string
	// startCosts are the v1 starts' costs New measured to choose
	// between them (Config.CgroupV1Start); nil when it did not.
	startCosts *cgroup.StartCosts
	// starts makes the namespaces commands start in (internal/startns);
	// nil without mount trees.
	starts *startns.Namespaces
	// noStartNamespace warns, once, that commands start in the host's
	// mount namespace.
	noStartNamespace sync.Once
	// bundles is Config.ContainerBundles.
	bundles string
	// podCgroups are the managers of the Pods' cgroups instances run in
	// (Instance.Pod), by cgroup; under mu.
	podCgroups map[string]*cgroup.Manager
}

var _ runtimes.Runtime = (*Runtime)(nil)

// New returns a bwrap driver. It does not fail when bwrap is missing: that is
// reported as RuntimeUnavailable by Ensure, so a Sandbox says why.
func New(cfg Config) (*Runtime, error) {
	if !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("bwrap state directory %q must be an absolute path", cfg.StateDir)
	}
	switch cfg.CgroupV1Start {
	case "", StartAuto, StartStarter, StartMove:
	default:
		return nil, fmt.Errorf("the bwrap cgroup v1 start (CgroupV1Start, --bwrap-cgroup-v1-start) %q: must be %s, %s or %s", cfg.CgroupV1Start, StartAuto, StartStarter, StartMove)
	}
	var starter string
	if !cfg.JoinCgroupToStart && cfg.CgroupV1Start != StartMove {
		var err error
		if starter, err = findStarter(cfg.Starter, warningsOr(cfg.Warnings)); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating bwrap state directory: %w", err)
	}
	r := &Runtime{
		stateDir:  cfg.StateDir,
		bwrap:     cfg.Bwrap,
		lookupEnv: cfg.LookupEnv,
		warnings:  cfg.Warnings,
		host:      cfg.Host.withDefaults(),
		running:   map[string]map[*command]struct{}{},
		treeLocks: map[string]*sync.Mutex{},
		closures:  map[string][]string{},
	}
	if os.Geteuid() == 0 {
		r.trees = cfg.TreesDir
		if r.trees == "" {
			r.trees = defaultTrees(cfg.StateDir)
		}
		// A tmpfs of its own, unbindable: a command's start namespace, a
		// clone of the host's mounts, leaves every tree out
		// (internal/startns).
		if err := mounttree.MakeTreesMount(filepath.Dir(r.trees)); err != nil {
			return nil, fmt.Errorf("preparing the bwrap mount tree directory: %w", err)
		}
		// The Pods' containers' root file systems, one mount each, come
		// in below the bundles' directory: no command binds them from
		// there (an image is bound from its own mount in the trees).
		r.starts = startns.New(filepath.Dir(r.trees), cfg.ContainerBundles)
		if err := os.MkdirAll(r.trees, 0o711); err != nil {
			return nil, fmt.Errorf("preparing the bwrap mount tree directory: %w", err)
		}
		if cfg.TreesDir == "" {
			// Stale trees slow every mount on the host down: a failure to
			// remove one is a warning, not a reason to refuse to start.
			if err := claimTrees(cfg.StateDir, r.trees); err != nil {
				fmt.Fprintf(warningsOr(cfg.Warnings), "sandbox: removing stale mount trees: %v\n", err)
			}
		}
	}
	r.cgroups, r.cgroupErr = cgroup.New(cgroupName(cfg.StateDir), cfg.CgroupParent)
	if starter != "" && r.cgroups != nil && !r.cgroups.V2 && (cfg.CgroupV1Start == "" || cfg.CgroupV1Start == StartAuto) {
		var costs cgroup.StartCosts
		starter, costs = chooseStart(starter, warningsOr(cfg.Warnings))
		r.startCosts = &costs
	}
	r.starter = starter
	if r.cgroups != nil {
		r.cgroups.JoinToStart = cfg.JoinCgroupToStart
		r.cgroups.Starter = r.starter
	}
	r.joinToStart = cfg.JoinCgroupToStart
	r.allowUnlimited = cfg.AllowUnlimited
	r.bundles = cfg.ContainerBundles
	if r.bwrap == "" {
		r.bwrap = "bwrap"
	}
	if r.lookupEnv == nil {
		r.lookupEnv = os.LookupEnv
	}
	if r.warnings == nil {
		r.warnings = os.Stderr
	}
	return r, nil
}

// bubblewrap is the path of the bwrap every Ensure checks for and every
// command runs: looked up on PATH once, and again only when the file found
// is no longer an executable there (moved by an upgrade, uninstalled).
// Each lookup tries the directories of PATH in turn, a system call each:
// looked up at every pass and command, that was a dozen on a usual PATH.
// A bwrap installed later earlier on PATH is taken once the one found
// goes.
func (r *Runtime) bubblewrap() (string, error) {
	if p := r.bwrapFound.Load(); p != nil && unix.Faccessat(unix.AT_FDCWD, *p, unix.X_OK, unix.AT_EACCESS) == nil {
		return *p, nil
	}
	p, err := exec.LookPath(r.bwrap)
	if err != nil {
		r.bwrapFound.Store(nil)
		return "", err
	}
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	r.bwrapFound.Store(&p)
	return p, nil
}

// CgroupName is the name of the cgroup a driver over stateDir makes, with
// the default parent, below its own cgroup to hold its instances' cgroups.
func CgroupName(stateDir string) string { return cgroupName(stateDir) }

// cgroupName is the name of the cgroup below which a driver over stateDir
// makes its instances'.
func cgroupName(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "sandbox-controller-bwrap-" + hex.EncodeToString(sum[:6])
}

// samePod says whether a and b put an instance in the same cgroup.
func samePod(a, b *runtimes.Pod) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.CgroupRoot == b.CgroupRoot && a.Cgroup == b.Cgroup
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
	b, err := readRecord(r.statePath(name))
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

// readRecord reads the instance record at path (every pass, Ensure and
// command reads one) through its descriptor alone.
func readRecord(path string) ([]byte, error) {
	return fdfile.Read(path, make([]byte, 0, 4096), maxRecord, false)
}

// maxRecord bounds an instance record: a few kilobytes, more with many
// mounts and binaries.
const maxRecord = 16 << 20

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
		Overlay: runtimes.OverlayMountsHealth(rec.Instance, rec.Running),
	}
}

// Ensure lays out the agent's areas and records the instance as running.
func (r *Runtime) Ensure(_ context.Context, in runtimes.Instance) (runtimes.State, error) {
	if _, err := r.bubblewrap(); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonUnavailable, "ensuring", in.Name,
			"bubblewrap (%s) is not installed or not on PATH: install the bubblewrap package", r.bwrap)
	}
	// Every command binds the mount sources: one a bind cannot use would
	// leave an instance recorded as running that takes no command.
	if err := runtimes.CheckMountSources(in); err != nil {
		return runtimes.State{}, err
	}
	if in.Image != "" {
		// Every command opens the image again; one that cannot be opened
		// now would take no command.
		root, err := r.mountImage(in)
		if err != nil {
			return runtimes.State{}, runtimes.Errorf(runtimes.ReasonUnavailable, "ensuring", in.Name, "%w", err)
		}
		root.Close()
	}
	rec, err := r.load(in.Name)
	if err != nil {
		return runtimes.State{}, err
	}
	if rec != nil && rec.Owner != in.Owner {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonNameConflict, "ensuring", in.Name,
			"the instance belongs to Sandbox %s", rec.Owner)
	}
	if err := in.LayoutAreas(); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, "ensuring", in.Name, "%w", err)
	}
	var prev *runtimes.Instance
	if rec == nil {
		rec = &record{CreatedAt: time.Now().UTC().Truncate(time.Second), Owner: in.Owner}
	} else {
		prev = &rec.Instance
	}
	if err := runtimes.MountOverlays(prev, in); err != nil {
		return runtimes.State{}, err
	}
	if err := r.ensureInstanceTree(in, rec.ConfigHash != in.ConfigHash); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, "ensuring", in.Name, "%w", err)
	}
	if rec.Running && rec.ConfigHash == in.ConfigHash && r.hasCgroup(in) {
		return rec.state(), nil
	}
	if prev != nil && !samePod(prev.Pod, in.Pod) {
		// Its Pod was replaced: what still runs in the old one goes with
		// its cgroup.
		r.removeCgroup(*prev)
	}
	if err := r.ensureCgroup(in); err != nil {
		return runtimes.State{}, err
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
	r.removeTree(name)
	r.removeImageMount(name)
	r.removeCgroup(rec.Instance)
	runtimes.UnmountOverlays(rec.Instance, runtimes.Instance{})
	if !rec.Running {
		return nil
	}
	rec.Running = false
	return r.save(rec)
}

// Delete ends the instance's commands and forgets it. The areas stay.
func (r *Runtime) Delete(_ context.Context, name string) error {
	r.killAll(name)
	r.removeTree(name)
	r.removeImageMount(name)
	if rec, err := r.load(name); err == nil && rec != nil {
		r.removeCgroup(rec.Instance)
		runtimes.UnmountOverlays(rec.Instance, runtimes.Instance{})
	} else {
		r.removeCgroup(runtimes.Instance{Name: name})
	}
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

// Exec runs one allowed command in a fresh namespace set, or directly on
// the host when the runtime's environment disables the sandbox with one of
// the exact values the policy accepts.
func (r *Runtime) Exec(ctx context.Context, name string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	const op = "running a command in"
	rec, err := r.load(name)
	if err != nil {
		return runtimes.ExitStatus{}, err
	}
	if rec == nil || !rec.Running {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonNotFound, op, name, "the instance is not running")
	}
	value, disabled := policy.SandboxDisabled(r.getenv)
	var view *imageView
	if rec.Instance.Image != "" && !disabled {
		if view, err = r.openView(rec.Instance); err != nil {
			return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "%w", err)
		}
		defer view.Close()
	}
	c, err := r.prepare(rec.Instance, req, disabled, view)
	if err != nil {
		return runtimes.ExitStatus{}, &runtimes.Error{Reason: runtimes.ReasonRefused, Op: op, Name: name, Err: err}
	}

	if !disabled && rec.Instance.Identity.UID == 0 {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonRefused, op, name,
			"the instance has no agent identity (uid 0): agent commands never run as host root; describe it again with an agent id range")
	}

	var cmd *exec.Cmd
	var sinit *sandboxInit
	var infoW *os.File
	var extra []*os.File
	defer func() {
		for _, f := range extra {
			f.Close()
		}
	}()
	if disabled {
		fmt.Fprint(r.warnings, policy.DisabledWarning(value, os.Geteuid(), os.Getegid()))
		cmd = exec.CommandContext(ctx, c.Path, c.Args...)
		cmd.Args[0] = req.Argv[0]
		cmd.Dir = c.Workspace
		cmd.Env = c.Env
	} else {
		// Areas come from the instance's mount tree, the custom mounts
		// already in place beneath the workspace: bubblewrap binds no
		// destination the agent writes.
		if err = r.treeAreas(rec.Instance, &c); err != nil {
			return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonFailed, op, name, "%w", err)
		}
		// Git directories are bound from handles opened beneath their
		// mounts (runtimes.GitDir); one that cannot be opened is left out.
		dirs, _ := rec.Instance.OpenGitDirs()
		defer runtimes.CloseGitDirs(dirs)
		for _, d := range dirs {
			c.GitDirs = append(c.GitDirs, d.Bind.Target)
			extra = append(extra, d.Dir)
		}
		bin, lookErr := r.bubblewrap()
		if lookErr != nil {
			// exec looks again and says why it cannot start it.
			bin = r.bwrap
		}
		cmd = exec.CommandContext(ctx, bin, r.Args(rec.Instance, c)...)
		cmd.Args[0] = r.bwrap
		cmd.Env = []string{}
		if view != nil {
			// The image's descriptors first, as Args numbers them.
			cmd.ExtraFiles = append(cmd.ExtraFiles, view.files...)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, extra...)
		// bubblewrap names its sandbox's init on this pipe, so that a
		// kill reaches it (sandboxinit.go).
		if sinit, infoW, err = newSandboxInit(); err != nil {
			return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "%w", err)
		}
		cmd.Args = slices.Insert(cmd.Args, 1, "--info-fd", strconv.Itoa(3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, infoW)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	// bwrap's --die-with-parent ends the sandbox if we die; its own process
	// group lets Stop end it and anything it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Without the sandbox the command is the runtime's own, as the seed
	// says and the warning tells: the agent's id could not even reach its
	// workspace below the areas root, which only the runtime may search.
	if id := rec.Instance.Identity; !disabled && id.UID != 0 && uint32(os.Geteuid()) != id.UID {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: []uint32{}}
	}
	if err := fdfile.CloseInheritedOnExec(); err != nil {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "keeping this process's inherited descriptors from the command: %w", err)
	}
	tracked := &command{cmd: cmd, init: sinit}
	cmd.Cancel = func() error { return tracked.kill(initWait) }
	// A process that outlives the command and keeps its output open must
	// not hold the caller: once the command has exited, its output gets
	// OutputDrain to arrive and is then closed.
	cmd.WaitDelay = OutputDrain

	r.track(name, tracked)
	defer r.untrack(name, tracked)
	if sinit != nil {
		defer sinit.close()
	}
	err = r.run(rec.Instance, startMounts(r.trees, rec.Instance.Name, c), cmd, func(err error) {
		// bubblewrap holds its own copies of the image's and the git
		// directories' descriptors, and closes each once bound: the
		// controller keeps none for the command's life (an image's are
		// one for each allowlisted command in each command directory).
		view.Close()
		for _, f := range extra {
			f.Close()
		}
		if sinit == nil {
			return
		}
		// The command holds its own end now: the pipe ends when
		// bubblewrap has written to it, or is gone.
		infoW.Close()
		if err == nil {
			sinit.watch(cmd.Process.Pid)
		} else {
			sinit.abandon()
		}
	})
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return runtimes.ExitStatus{Code: 0}, nil
	case errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil:
		return runtimes.ExitStatus{Code: cmd.ProcessState.ExitCode()}, nil
	case errors.As(err, &exitErr):
		code := exitErr.ExitCode()
		if code < 0 {
			code = 128 + int(exitErr.Sys().(syscall.WaitStatus).Signal())
		}
		return runtimes.ExitStatus{Code: code}, nil
	default:
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "starting %s: %w", cmd.Path, err)
	}
}

// startMounts are the mounts of the driver's trees (below trees) a
// command c of instance name binds: its areas, and its image's mount.
// None when the areas are bound from their sources.
func startMounts(trees, name string, c Command) []string {
	if len(c.Areas) == 0 {
		return nil
	}
	mounts := make([]string, 0, len(c.Areas)+1)
	for _, a := range c.Areas {
		mounts = append(mounts, a.Source)
	}
	if c.Image != nil {
		mounts = append(mounts, filepath.Join(trees, imagesDir, name))
	}
	return mounts
}

func (r *Runtime) getenv(k string) string {
	v, _ := r.lookupEnv(k)
	return v
}

// Command is one checked command, ready to run.
type Command struct {
	// Path is the host path of the executable.
	Path string
	// Args are the command's arguments, argv[1:].
	Args []string
	// Env is the complete environment, built by the policy.
	Env []string
	// Binds are host paths bound read-only at the same place (the Nix store
	// requisites of the command).
	Binds []string
	// Workspace is the agent's workspace directory on the host.
	Workspace string
	// Areas are the areas as the instance's mount tree holds them, custom
	// mounts included; empty means the areas and custom mounts are bound
	// from their sources (a driver that is not root has no mount tree).
	Areas []runtimes.Bind
	// Image, for an instance with an Image, is what the command sees of
	// it: its descriptors come first among those the command inherits
	// (3, 4, ...), before the git directories'.
	Image *imageView
	// GitDirs are the targets of the instance's git directory binds, bound
	// from the descriptors the command inherits after the image's
	// (ExtraFiles).
	GitDirs []string
}

// prepare applies the policy: the allowlist and argv checks, the lookup of
// the command on the host, and the environment rebuilt from nothing.
func (r *Runtime) prepare(in runtimes.Instance, req runtimes.ExecRequest, disabled bool, view *imageView) (Command, error) {
	if len(req.Env) > 0 {
		return Command{}, fmt.Errorf("%w: the request carries environment variables; the environment is rebuilt by the sandbox policy from the passthrough list, workspace/%s and the locale, never taken from a request", policy.ErrRefused, policy.DotEnvFile)
	}
	if err := policy.CheckArgv(in.Binaries, req.Argv); err != nil {
		return Command{}, err
	}
	var bin string
	var err error
	if view != nil {
		bin, err = view.look(req.Argv[0], in.Image)
	} else {
		bin, err = r.lookHost(req.Argv[0])
	}
	if err != nil {
		return Command{}, err
	}
	wsBind, ok := in.Workspace()
	if !ok {
		return Command{}, fmt.Errorf("instance %s has no /workspace area", in.Name)
	}
	ws := wsBind.Source
	dotEnv, err := in.DotEnv()
	if err != nil {
		return Command{}, err
	}
	src := policy.EnvSources{Passthrough: in.Env, Lookup: r.lookupEnv, DotEnv: dotEnv, Proxy: in.ProxyURL()}
	if disabled {
		// /workspace does not exist on the host: HOME is the workspace
		// there too, at its host path.
		src.Home = ws
	}
	env, err := policy.BuildEnv(src)
	if err != nil {
		return Command{}, err
	}
	c := Command{Path: bin, Args: req.Argv[1:], Env: env, Workspace: ws, Image: view}
	if disabled || view != nil {
		return c, nil
	}
	c.Path, c.Binds, err = r.nixClosure(bin)
	if err != nil {
		return Command{}, err
	}
	return c, nil
}

func (r *Runtime) track(name string, c *command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.running[name]
	if set == nil {
		set = map[*command]struct{}{}
		r.running[name] = set
	}
	set[c] = struct{}{}
}

func (r *Runtime) untrack(name string, c *command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running[name], c)
}

// killAll kills the instance's running commands, each with its sandbox's
// init if bubblewrap has named it (a stop also kills what is left in the
// instance's cgroup).
func (r *Runtime) killAll(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.running[name] {
		if c.cmd.Process != nil {
			_ = c.kill(0)
		}
	}
}

// lookHost finds an allowed command in the host search path.
func (r *Runtime) lookHost(name string) (string, error) {
	for _, dir := range r.host.SearchPath {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q is allowed but not installed on the host (looked in %s)", name, strings.Join(r.host.SearchPath, ":"))
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

// usbSysfs are the read-only sysfs directories USB libraries enumerate
// devices through (libusb reads /sys/bus/usb/devices, whose entries link
// into /sys/devices), and udev's device database.
var usbSysfs = []string{"/sys/bus/usb", "/sys/devices", "/sys/dev/char", "/run/udev/data"}

// Args builds the complete bwrap argument list for one command: the
// namespaces, the read-only host, the standard areas and mounts, devices,
// the environment, then the command and its arguments.
func (r *Runtime) Args(in runtimes.Instance, c Command) []string {
	a := make([]string, 0, 96+3*len(c.Binds)+2*len(c.Env)+len(c.Args))
	a = append(a, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL")
	if in.Network != nil {
		// Started inside the instance's network namespace (startIn), the
		// sandbox keeps it: its only way out is the proxy there.
		a = append(a, "--share-net")
	}
	fd := 3
	if c.Image != nil {
		a = c.Image.args(a, fd)
		fd += len(c.Image.files)
	} else {
		a = r.hostSystem(a, in.Binaries)
	}
	a = append(a, "--proc", "/proc")
	switch {
	case in.Devices.All:
		a = append(a, "--dev-bind", "/dev", "/dev")
	case in.Devices.USB:
		a = append(a, "--dev", "/dev", "--dev-bind-try", r.host.USBDevices, "/dev/bus/usb")
		for _, d := range usbSysfs {
			a = append(a, "--ro-bind-try", d, d)
		}
	default:
		a = append(a, "--dev", "/dev")
	}
	a = append(a, "--size", strconv.Itoa(TmpSize), "--tmpfs", "/tmp")
	// After /tmp, so that a command or store path below /tmp stays visible.
	for _, b := range c.Binds {
		a = append(a, "--ro-bind", b, b)
	}
	if !underSystemDir(c.Path) && !slices.ContainsFunc(c.Binds, func(b string) bool { return within(c.Path, b) }) {
		a = append(a, "--ro-bind", c.Path, c.Path)
	}
	if len(c.Areas) > 0 {
		for _, b := range c.Areas {
			a = append(a, bindFlag(b.ReadOnly), b.Source, b.Target)
		}
	} else {
		for _, b := range in.Areas {
			a = append(a, bindFlag(b.ReadOnly), b.Source, b.Target)
		}
		for _, m := range in.Mounts {
			if !m.GitDir {
				a = append(a, bindFlag(m.ReadOnly), m.Source, m.Target)
			}
		}
	}
	for _, t := range c.GitDirs {
		a = append(a, "--bind-fd", strconv.Itoa(fd), t)
		fd++
	}
	a = append(a, "--remount-ro", "/", "--chdir", policy.SandboxHome, "--clearenv")
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			a = append(a, "--setenv", k, v)
		}
	}
	a = append(a, "--", c.Path)
	return append(a, c.Args...)
}

// hostSystem binds the host's system directories, its command
// directories holding only the allowlisted commands, and its /etc files.
func (r *Runtime) hostSystem(a []string, binaries []string) []string {
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
	a = r.commandDirs(a, binaries)
	for _, f := range hostFiles {
		a = append(a, "--ro-bind-try", f, f)
	}
	return a
}

// commandDirs are where a shell looks for commands. In the sandbox each
// holds only the allowlisted commands, so that an allowed command that runs
// others (git's "!" aliases, a pager, an editor) finds no shell unless the
// Sandbox allows one; the libraries and data below /usr stay readable.
var commandDirs = []string{"/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin"}

// commandDirs hides every command directory of the read-only system under
// an empty read-only tmpfs and binds back the allowlisted commands found in
// it. A command directory that is a link (merged /usr) follows its target.
func (r *Runtime) commandDirs(a []string, binaries []string) []string {
	var hidden []string
	for _, d := range commandDirs {
		if !underSystemDir(d) {
			continue
		}
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() {
			continue
		}
		a = append(a, "--tmpfs", d)
		hidden = append(hidden, d)
		for _, b := range binaries {
			p := filepath.Join(d, b)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				a = append(a, "--ro-bind", p, p)
			}
		}
	}
	for _, d := range hidden {
		a = append(a, "--remount-ro", d)
	}
	return a
}

func bindFlag(ro bool) string {
	if ro {
		return "--ro-bind"
	}
	return "--bind"
}

func underSystemDir(p string) bool {
	return slices.ContainsFunc(systemDirs, func(d string) bool { return within(p, d) })
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// warningsOr is w, or stderr when nil.
func warningsOr(w io.Writer) io.Writer {
	if w == nil {
		return os.Stderr
	}
	return w
}

// TreesDir is where a driver over stateDir keeps its instances' mount
// trees by default.
func TreesDir(stateDir string) string { return defaultTrees(stateDir) }

func defaultTrees(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return filepath.Join(DefaultTreesDir, hex.EncodeToString(sum[:6]))
}

// DetachTrees detaches the mount trees of every instance a driver over
// stateDir (with the default TreesDir) left, so that the areas can be
// removed: an administrator retiring a node, or a test cleaning up. The
// controller itself never calls it: a restarted controller adopts running
// instances with their trees. Running commands keep their own copies.
// The cgroups that driver made go too where nothing runs any more (as for
// an abandoned state directory, StaleTrees.Remove): a cgroup with a
// running command stays, and a driver that starts again makes them anew.
func DetachTrees(stateDir string) error {
	return errors.Join(removeTreesDir(defaultTrees(stateDir)), cgroup.RemoveUnused(cgroupName(stateDir)))
}

func (r *Runtime) treeLock(name string) *sync.Mutex {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.treeLocks[name]
	if l == nil {
		l = &sync.Mutex{}
		r.treeLocks[name] = l
	}
	return l
}

// ensureTree returns the directory of in's current mount tree, building a
// new generation when rebuild is set (a new configuration) or the current
// tree is not what it should be: missing after a reboot, or a mount point
// moved along with a directory the agent renamed. A moved mount that
// cannot be put back because the agent left a link on its destination's
// path stays where the agent moved it, inside the workspace, so the agent
// can still run the commands that repair it.
func (r *Runtime) ensureTree(in runtimes.Instance, rebuild bool) (string, error) {
	l := r.treeLock(in.Name)
	l.Lock()
	defer l.Unlock()
	g := r.generations(in.Name)
	t := mounttree.For(in)
	cur, ok := g.Current()
	t.Dir = cur
	if ok && !rebuild && t.Verify() == nil {
		return cur, nil
	}
	if ok && !rebuild && t.Blocked() && t.VerifyAreas() == nil {
		return cur, nil
	}
	dir, err := g.Build(t)
	if err != nil && ok && !rebuild && t.VerifyAreas() == nil {
		return cur, nil
	}
	return dir, err
}

func (r *Runtime) ensureInstanceTree(in runtimes.Instance, rebuild bool) error {
	if r.trees == "" {
		return nil
	}
	_, err := r.ensureTree(in, rebuild)
	return err
}

func (r *Runtime) generations(name string) mounttree.Generations {
	return mounttree.Generations{Dir: filepath.Join(r.trees, name)}
}

func (r *Runtime) removeTree(name string) {
	if r.trees == "" {
		return
	}
	l := r.treeLock(name)
	l.Lock()
	defer l.Unlock()
	_ = r.generations(name).Remove()
}

// treeAreas checks the instance's mount tree (building a new one when it is
// not what it should be) and records in c the areas to bind from it.
// bubblewrap resolves a bind's source by path, even one given as a
// descriptor, so every source here is a path below the tree directory,
// which only the controller writes.
func (r *Runtime) treeAreas(in runtimes.Instance, c *Command) error {
	if r.trees == "" {
		return nil
	}
	dir, err := r.ensureTree(in, false)
	if err != nil {
		return err
	}
	t := mounttree.For(in)
	t.Dir = dir
	for _, a := range t.Areas {
		c.Areas = append(c.Areas, runtimes.Bind{Source: t.Path(a.Name), Target: "/" + a.Name, ReadOnly: a.ReadOnly})
	}
	return nil
}
