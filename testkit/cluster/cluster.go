// Package cluster runs the pieces of a deployment as separate processes a
// test can kill -9 and start again: a throw-away kube-apiserver and etcd
// (envtest's binaries, the project's CRDs installed) and the real
// sandbox-controller binary pointed at them by a kubeconfig. The chaos
// suite kills them at random moments; the hostile-manifest suite watches
// the controller's reconcile counts and CPU time. It is test code: nothing
// outside *_test.go imports it.
package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/internal/procstat"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// ControlPlane is etcd and a kube-apiserver whose process can be killed
// and started again with the same flags, certificates, port and etcd: what
// an API server crash and its restart by a supervisor look like.
type ControlPlane struct {
	env *envtest.Environment
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a direct client (no cache) with the project's types.
	Client client.Client
	// Kubeconfig is an administrator kubeconfig file for the controller.
	Kubeconfig string

	mu      sync.Mutex
	argv    []string
	environ []string
	pid     int       // envtest's own kube-apiserver until the first kill
	own     *exec.Cmd // ours after that
	ownDone chan struct{}
	logPath string
}

// StartControlPlane starts etcd and kube-apiserver from KUBEBUILDER_ASSETS
// with the CRDs in crdDir, and writes a kubeconfig below dir.
func StartControlPlane(crdDir, dir string) (*ControlPlane, error) {
	env := &envtest.Environment{CRDDirectoryPaths: []string{crdDir}, ErrorIfCRDPathMissing: true}
	cfg, err := localcp.StartEnvironment(env)
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	cp := &ControlPlane{env: env, Config: cfg, logPath: filepath.Join(dir, "kube-apiserver.log")}
	if err := cp.setup(dir); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	return cp, nil
}

func (cp *ControlPlane) setup(dir string) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating a client of the control plane: %w", err)
	}
	cp.Client = c
	user, err := cp.env.AddUser(envtest.User{Name: "controller", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("creating the controller's user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("writing the controller's kubeconfig: %w", err)
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kc, 0o600); err != nil {
		return fmt.Errorf("writing the controller's kubeconfig: %w", err)
	}
	// envtest starts kube-apiserver as a child of this process; its command
	// line and environment are what a restart runs again.
	pid, err := childNamed("kube-apiserver")
	if err != nil {
		return err
	}
	if cp.argv, err = procStrings(pid, "cmdline"); err != nil {
		return err
	}
	if cp.environ, err = procStrings(pid, "environ"); err != nil {
		return err
	}
	cp.pid = pid
	return nil
}

// KillAPIServer sends SIGKILL to kube-apiserver and waits until it is gone.
// etcd keeps running, as it would beside a crashed API server.
func (cp *ControlPlane) KillAPIServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.own != nil {
		_ = cp.own.Process.Kill()
		<-cp.ownDone
		cp.own = nil
		return nil
	}
	if cp.pid == 0 {
		return errors.New("kube-apiserver is not running")
	}
	if err := syscall.Kill(cp.pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing kube-apiserver (pid %d): %w", cp.pid, err)
	}
	// envtest waits for its child, so the pid goes once it is reaped.
	for range 200 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", cp.pid)); errors.Is(err, os.ErrNotExist) {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	cp.pid = 0
	return nil
}

// StartAPIServer starts kube-apiserver again with the flags it had and
// returns at once; WaitReady says when it answers.
func (cp *ControlPlane) StartAPIServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.own != nil || cp.pid != 0 {
		return errors.New("kube-apiserver is already running")
	}
	logf, err := os.OpenFile(cp.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the kube-apiserver log: %w", err)
	}
	runCtx, cancel := context.WithTimeout(context.Background(), MaxRun)
	cmd := exec.CommandContext(runCtx, cp.argv[0], cp.argv[1:]...)
	cmd.Env = cp.environ
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		cancel()
		_ = logf.Close()
		return fmt.Errorf("starting kube-apiserver again: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		cancel()
		_ = logf.Close()
		close(done)
	}()
	cp.own, cp.ownDone = cmd, done
	return nil
}

// WaitReady polls /readyz until the API server answers ok or ctx ends.
func (cp *ControlPlane) WaitReady(ctx context.Context) error {
	rc, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		return err
	}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cp.Config.Host, "/")+"/readyz", nil)
		if resp, err := rc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver to be ready: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops kube-apiserver (ours or envtest's) and etcd and removes their data.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	if cp.own != nil {
		_ = cp.own.Process.Signal(syscall.SIGTERM)
		select {
		case <-cp.ownDone:
		case <-time.After(20 * time.Second):
			_ = cp.own.Process.Kill()
			<-cp.ownDone
		}
		cp.own = nil
	}
	cp.mu.Unlock()
	return cp.env.Stop()
}

// childNamed finds this process's child whose command name is name.
func childNamed(name string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procstat.Read(pid)
		if err != nil {
			continue
		}
		if st.Comm == name && st.PPid == self {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no child process named %s", name)
}

func procStrings(pid int, file string) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return nil, fmt.Errorf("reading the %s of pid %d: %w", file, pid, err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

// MaxRun bounds one run of a child process (kube-apiserver started again,
// the controller): longer than any suite runs, so a child a test forgot to
// stop is killed with the test binary's run, not left on the host.
const MaxRun = 90 * time.Minute

// Controller is the sandbox-controller binary run as a child process.
type Controller struct {
	// Bin is the binary; Args its flags (a metrics address is added).
	Bin  string
	Args []string
	// Env is added to this process's environment.
	Env []string
	// LogPath receives the output of every run, appended.
	LogPath string

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{}
	metricsAddr string
	// Starts and Kills count the runs started and the SIGKILLs sent.
	Starts, Kills int
}

// BuildController builds ./cmd/sandbox-controller of the module at root
// into dir, unless SANDBOX_CONTROLLER_BIN names a binary already built
// (make build).
func BuildController(root, dir string) (string, error) {
	if b := os.Getenv("SANDBOX_CONTROLLER_BIN"); b != "" {
		return b, nil
	}
	out := filepath.Join(dir, "sandbox-controller")
	cmd, cancel := testenv.Command(10*time.Minute, "go", "build", "-o", out, "./cmd/sandbox-controller")
	defer cancel()
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the controller: %w: %s", err, b)
	}
	return out, nil
}

// Start runs the controller; it returns once the process exists (the
// manager connects to the API server on its own).
func (c *Controller) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("the controller is already running")
	}
	if c.metricsAddr == "" {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		c.metricsAddr = addr
	}
	logf, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the controller log: %w", err)
	}
	fmt.Fprintf(logf, "\n==== start %d at %s ====\n", c.Starts+1, time.Now().Format(time.RFC3339Nano))
	runCtx, cancel := context.WithTimeout(context.Background(), MaxRun)
	cmd := exec.CommandContext(runCtx, c.Bin, append(append([]string{}, c.Args...), "--metrics-bind-address", c.metricsAddr)...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a kill of the test's group in a terminal
	// does not count as one of the test's kills.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		cancel()
		_ = logf.Close()
		return fmt.Errorf("starting the controller: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		cancel()
		_ = logf.Close()
		close(done)
	}()
	c.cmd, c.done = cmd, done
	c.Starts++
	return nil
}

// Kill sends SIGKILL and waits until the process is gone.
func (c *Controller) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return errors.New("the controller is not running")
	}
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing the controller: %w", err)
	}
	<-c.done
	c.cmd = nil
	c.Kills++
	return nil
}

// Exited says whether a started controller has ended on its own.
func (c *Controller) Exited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.done:
		c.cmd = nil
		return true
	default:
		return false
	}
}

// Stop ends the controller gracefully (SIGTERM), as a rollout would.
func (c *Controller) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.cmd = nil
	return nil
}

// CPUTicks is the user and system time the running controller has used,
// in clock ticks (USER_HZ, 100 a second on Linux).
func (c *Controller) CPUTicks() (uint64, error) {
	c.mu.Lock()
	cmd := c.cmd
	c.mu.Unlock()
	if cmd == nil {
		return 0, errors.New("the controller is not running")
	}
	st, err := procstat.Read(cmd.Process.Pid)
	if err != nil {
		return 0, fmt.Errorf("reading the controller's CPU time: %w", err)
	}
	return st.UTime + st.STime, nil
}

// Reconciles reads controller_runtime_reconcile_total from the running
// controller's metrics, summed over results, by controller name
// ("sandbox", "sessionclaim").
func (c *Controller) Reconciles(ctx context.Context) (map[string]int, error) {
	c.mu.Lock()
	addr := c.metricsAddr
	c.mu.Unlock()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the controller's metrics: %w", err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "controller_runtime_reconcile_total{") {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, "controller_runtime_reconcile_total{"), "} ")
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(l, "="); ok && k == "controller" {
				out[strings.Trim(v, `"`)] += int(n)
			}
		}
	}
	return out, sc.Err()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port for the controller's metrics: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// RepoRoot is the directory holding go.mod above the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
