// Package containerd is the containerd sandbox driver: one long-lived
// container per agent, named cireilclaw-{agent}, in a containerd namespace
// of its own. Commands run in it as exec processes, so files the agent
// writes in the container's root persist across stop and start; the agent's
// areas and mounts are host directories bound into it.
//
// The driver never pulls an image (a missing one is ImageNotFound), never
// touches a container it did not label as its own, and never removes or
// rewrites anything in the agent's areas. A daemon it cannot reach is
// reported as RuntimeUnavailable from every call, never as a panic or a
// failed constructor, so the controller requeues until it is back.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/runtimes/mountns"
)

// Defaults of Config.
const (
	DefaultNamespace   = "sandbox-controller"
	DefaultSnapshotter = "overlayfs"
	DefaultRuntime     = "io.containerd.runc.v2"
	DefaultDialTimeout = 2 * time.Second
)

// DefaultInit is the container's first process when Config.Init is empty: it
// never exits, so the task stays up between commands, and it reaps every
// process orphaned to it (a shell's wait takes any child that ends), so the
// processes a command left behind do not stay as zombies holding the pids
// limit forever. It ends on SIGTERM. Any image with a POSIX shell and sleep
// (busybox, coreutils) has what it needs.
var DefaultInit = []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"}

// Config configures the driver.
type Config struct {
	// Address is containerd's gRPC socket.
	Address string
	// Namespace is the containerd namespace the containers live in, and
	// where images are looked up. Empty means DefaultNamespace.
	Namespace string
	// Snapshotter makes the containers' writable roots. Empty means
	// DefaultSnapshotter; overlay health is only reported for overlayfs.
	Snapshotter string
	// Runtime is the shim. Empty means DefaultRuntime.
	Runtime string
	// Init is the long-running first process, looked up in the image.
	// Empty means DefaultInit.
	Init []string
	// FIFODir holds the named pipes of running commands' stdio. Empty
	// means containerd's default (/run/containerd/fifo).
	FIFODir string
	// LookupEnv reads the controller's own environment for the locale and
	// the passthrough variables. Nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// DialTimeout bounds a reconnection attempt after the daemon went
	// away; it is also the longest backoff between attempts, so a restarted
	// daemon is seen again within about this long. Zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// ProcDir is where the driver reads a task's mount table to check its
	// root; empty means /proc. The controller must share containerd's view
	// of the host's file system for overlay health to mean anything.
	ProcDir string
	// TreesDir holds the instances' mount trees (trees.go), which runc
	// binds the areas from, in the mount namespace runc resolves it in
	// (MountNamespace). Its parent is made a private mount there. Empty
	// means a directory of DefaultTreesDir named after Address and
	// Namespace.
	TreesDir string
	// MountNamespace is the mount namespace of containerd and its runc:
	// the mount trees are built and removed there, on a thread that joins
	// it (runtimes/mountns.RunInNamespace). DaemonMountNamespace finds it each
	// time from the process answering Address (a controller in a pod with
	// the node's pids, hostPID); otherwise it is a namespace file, opened
	// once by New and held (a /proc/PID path opened again later could name
	// another process by then). The
	// sources of areas and custom mounts must be at the same paths there
	// as in the controller's view. Empty means the controller's own
	// namespace (it runs on the node).
	MountNamespace string
}

// Runtime is the containerd driver.
type Runtime struct {
	cfg Config

	mu     sync.Mutex
	client *containerd.Client

	// treesMu serialises building and removing mount trees; treesPrivate
	// says TreesDir has been made a private mount.
	treesMu      sync.Mutex
	treesPrivate bool
	// treesNS is Config.MountNamespace opened, when it names a file.
	treesNS *os.File
	// swap says the kernel accounts swap in memory cgroups: a memory limit
	// then forbids swap beyond it (runc fails to write a swap limit the
	// kernel does not have).
	swap bool
}

var (
	_ runtimes.Runtime = (*Runtime)(nil)
	_ runtimes.Pinger  = (*Runtime)(nil)
)

// New returns a containerd driver. It fails only on a configuration that
// can never work; a daemon that is down is reported by each call instead.
func New(_ context.Context, cfg Config) (*Runtime, error) {
	if cfg.Address == "" {
		return nil, errors.New("containerd driver: the socket address is empty")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if err := identifiers.Validate(cfg.Namespace); err != nil {
		return nil, fmt.Errorf("containerd driver: namespace %q: %w", cfg.Namespace, err)
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = DefaultSnapshotter
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if len(cfg.Init) == 0 {
		cfg.Init = DefaultInit
	}
	if cfg.LookupEnv == nil {
		cfg.LookupEnv = os.LookupEnv
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.TreesDir == "" {
		cfg.TreesDir = defaultTrees(cfg.Address, cfg.Namespace)
	}
	if !filepath.IsAbs(cfg.TreesDir) {
		return nil, fmt.Errorf("containerd driver: mount tree directory %q must be an absolute path", cfg.TreesDir)
	}
	r := &Runtime{cfg: cfg, swap: cgroup.SwapAccounted()}
	if cfg.MountNamespace != "" && cfg.MountNamespace != DaemonMountNamespace {
		f, err := os.Open(cfg.MountNamespace)
		if err != nil {
			return nil, fmt.Errorf("containerd driver: the mount namespace of containerd: %w", err)
		}
		if err := mountns.IsMountNamespace(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("containerd driver: the mount namespace of containerd, %s: %w", cfg.MountNamespace, err)
		}
		r.treesNS = f
	}
	return r, nil
}

// Namespace is the containerd namespace the driver works in.
func (r *Runtime) Namespace() string { return r.cfg.Namespace }

// Client returns the driver's containerd client, connecting on first use.
// The gRPC connection reconnects by itself after the daemon restarts.
func (r *Runtime) Client() (*containerd.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client != nil {
		return r.client, nil
	}
	c, err := containerd.New(r.cfg.Address,
		containerd.WithDefaultNamespace(r.cfg.Namespace),
		containerd.WithTimeout(r.cfg.DialTimeout))
	if err != nil {
		return nil, fmt.Errorf("connecting to containerd at %s: %w", r.cfg.Address, err)
	}
	r.client = c
	return c, nil
}

// Close closes the connection to the daemon. Containers keep running.
func (r *Runtime) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil {
		return nil
	}
	err := r.client.Close()
	r.client = nil
	return err
}

// scope puts the driver's namespace on ctx: every containerd call is made
// in it, whatever namespace the client was made with.
func (r *Runtime) scope(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

// connect returns the client and ctx scoped to the namespace.
func (r *Runtime) connect(ctx context.Context, op, name string) (context.Context, *containerd.Client, error) {
	c, err := r.Client()
	if err != nil {
		return nil, nil, runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "%w", err)
	}
	return r.scope(ctx), c, nil
}

// fail wraps a containerd error with the reason the controller reports.
func (r *Runtime) fail(op, name string, err error) error {
	var re *runtimes.Error
	if errors.As(err, &re) {
		return err
	}
	switch {
	case unreachable(err):
		return runtimes.Errorf(runtimes.ReasonUnavailable, op, name, "containerd at %s is unreachable: %w", r.cfg.Address, err)
	case errdefs.IsNotFound(err):
		return &runtimes.Error{Reason: runtimes.ReasonNotFound, Op: op, Name: name, Err: err}
	default:
		return &runtimes.Error{Reason: runtimes.ReasonFailed, Op: op, Name: name, Err: err}
	}
}

// unreachable says whether err means the daemon could not be reached, as
// opposed to the daemon refusing the call.
func unreachable(err error) bool {
	if errdefs.IsUnavailable(err) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable
}

// Import loads the images of an OCI image-layout tarball into the
// driver's namespace and unpacks them for its snapshotter, so containers
// can be made from them without a registry. It returns the image names.
func (r *Runtime) Import(ctx context.Context, tarball io.Reader) ([]string, error) {
	const op = "importing images into namespace"
	ctx, c, err := r.connect(ctx, op, r.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	imgs, err := c.Import(ctx, tarball)
	if err != nil {
		return nil, r.fail(op, r.cfg.Namespace, err)
	}
	names := make([]string, 0, len(imgs))
	for _, i := range imgs {
		if err := containerd.NewImage(c, i).Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, r.fail(op, r.cfg.Namespace, fmt.Errorf("unpacking %s: %w", i.Name, err))
		}
		names = append(names, i.Name)
	}
	return names, nil
}
