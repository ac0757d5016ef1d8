package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Exec runs one allowed command in the running container: argv through the
// exec policy, the environment rebuilt by it, in /workspace as the agent's
// own host identity (never root). stdin, stdout and stderr are streamed;
// cancelling ctx kills the command.
func (r *Runtime) Exec(ctx context.Context, name string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	const op = "running a command in"
	if len(req.Env) > 0 {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonRefused, op, name,
			"%w: the request carries environment variables; the environment is rebuilt by the sandbox policy from the passthrough list, workspace/%s and the locale, never taken from a request",
			policy.ErrRefused, policy.DotEnvFile)
	}
	ctx, c, err := r.connect(ctx, op, name)
	if err != nil {
		return runtimes.ExitStatus{}, err
	}
	cont, err := c.LoadContainer(ctx, name)
	if errdefs.IsNotFound(err) {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonNotFound, op, name, "the container does not exist")
	}
	if err != nil {
		return runtimes.ExitStatus{}, r.fail(op, name, err)
	}
	info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return runtimes.ExitStatus{}, r.fail(op, name, err)
	}
	in, err := decodeInstance(info)
	if err != nil {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonFailed, op, name, "%w", err)
	}
	proc, err := r.command(info, in, req.Argv)
	if err != nil {
		return runtimes.ExitStatus{}, &runtimes.Error{Reason: runtimes.ReasonRefused, Op: op, Name: name, Err: err}
	}
	task, running, err := taskOf(ctx, cont)
	if err != nil {
		return runtimes.ExitStatus{}, r.fail(op, name, err)
	}
	if !running {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonNotFound, op, name, "the container is not running")
	}
	code, err := r.run(ctx, task, proc, req)
	if err != nil {
		return runtimes.ExitStatus{}, r.fail(op, name, err)
	}
	return runtimes.ExitStatus{Code: code}, nil
}

// command applies the policy to argv and builds the process: the
// container's own capabilities and no-new-privileges, the agent's identity
// from the record (a container converged before agents had their own
// identity carries none, and runs nothing until it is converged again),
// the environment from nothing.
func (r *Runtime) command(info containers.Container, in runtimes.Instance, argv []string) (*specs.Process, error) {
	if err := policy.CheckArgv(in.Binaries, argv); err != nil {
		return nil, err
	}
	user, err := agentUser(in)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", policy.ErrRefused, err)
	}
	if _, ok := in.Workspace(); !ok {
		return nil, fmt.Errorf("instance %s has no %s area", in.Name, policy.SandboxHome)
	}
	dotEnv, err := in.DotEnv()
	if err != nil {
		return nil, err
	}
	env, err := policy.BuildEnv(policy.EnvSources{Passthrough: in.Env, Lookup: r.cfg.LookupEnv, DotEnv: dotEnv, Proxy: in.ProxyURL()})
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if info.Spec == nil {
		return nil, fmt.Errorf("container %s has no spec", in.Name)
	}
	if err := json.Unmarshal(info.Spec.GetValue(), &spec); err != nil {
		return nil, fmt.Errorf("container %s: decoding its spec: %w", in.Name, err)
	}
	if spec.Process == nil {
		return nil, fmt.Errorf("container %s: its spec has no process", in.Name)
	}
	p := *spec.Process
	p.User = user
	p.Args = append([]string(nil), argv...)
	p.Env = env
	p.Cwd = policy.SandboxHome
	p.Terminal = false
	return &p, nil
}

// run starts proc in task and waits for it, or kills it when ctx ends.
func (r *Runtime) run(ctx context.Context, task containerd.Task, spec *specs.Process, req runtimes.ExecRequest) (int, error) {
	id, err := execID()
	if err != nil {
		return 0, err
	}
	var stdin *stdinCloser
	var in io.Reader
	if req.Stdin != nil {
		stdin = &stdinCloser{r: req.Stdin, started: make(chan containerd.Process, 1)}
		// Until the process is started, nothing is there to close.
		defer stdin.arm(nil)
		in = stdin
	}
	// The shim needs somewhere to put both outputs, wanted or not.
	stdout, stderr := runtimes.OutputWriters(req.Stdout, req.Stderr)
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	streams := []cio.Opt{cio.WithStreams(in, stdout, stderr)}
	if r.cfg.FIFODir != "" {
		streams = append(streams, cio.WithFIFODir(r.cfg.FIFODir))
	}
	proc, err := task.Exec(ctx, id, spec, cio.NewCreator(streams...))
	if err != nil {
		return 0, fmt.Errorf("creating process %v: %w", spec.Args, err)
	}
	// Cleanup must run even when ctx is what ended the command.
	cleanup := context.WithoutCancel(ctx)
	defer func() { _, _ = proc.Delete(cleanup) }()

	// Wait before Start, so the exit is never missed; the wait outlives
	// ctx, because after a kill the exit is still to be collected.
	waitCtx, cancelWait := context.WithCancel(cleanup)
	defer cancelWait()
	exited, err := proc.Wait(waitCtx)
	if err != nil {
		return 0, fmt.Errorf("waiting on process %v: %w", spec.Args, err)
	}
	// Start is not cut short by ctx: a cancel that lands while the shim is
	// starting the process is handled below, like one that lands later, by
	// killing the process, so the caller always gets its exit status.
	if err := proc.Start(cleanup); err != nil {
		_ = proc.Kill(cleanup, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
		return 0, fmt.Errorf("starting process %v: %w", spec.Args, err)
	}
	if stdin != nil {
		stdin.ctx = cleanup
		stdin.arm(proc)
	}
	var st containerd.ExitStatus
	select {
	case st = <-exited:
		// The process is gone; its output may still be in the pipes.
		proc.IO().Wait()
	case <-ctx.Done():
		if err := proc.Kill(cleanup, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("killing process %v after its context ended: %w", spec.Args, err)
		}
		st = <-exited
		// A child the command left behind may hold the pipes open: stop
		// copying rather than wait for it.
		proc.IO().Cancel()
	}
	code, _, err := st.Result()
	if err != nil {
		return 0, fmt.Errorf("collecting the exit of process %v: %w", spec.Args, err)
	}
	return int(code), nil
}

func execID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making an exec id: %w", err)
	}
	return "exec-" + hex.EncodeToString(b), nil
}

// stdinCloser passes the caller's stdin on and, at its end, tells the shim
// to close the process's stdin: the shim holds the stdin pipe open itself,
// so the command would never see end of file otherwise.
type stdinCloser struct {
	r       io.Reader
	ctx     context.Context
	started chan containerd.Process
	armed   sync.Once
	closed  sync.Once
}

// arm hands over the started process, or nil when it never started.
func (s *stdinCloser) arm(p containerd.Process) {
	s.armed.Do(func() { s.started <- p })
}

func (s *stdinCloser) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if err == io.EOF {
		s.closed.Do(func() {
			if p := <-s.started; p != nil {
				_ = p.CloseIO(s.ctx, containerd.WithStdinCloser)
			}
		})
	}
	return n, err
}
