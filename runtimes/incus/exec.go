package incus

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
)

// Exec runs one allowed command in the instance as the agent's account, in
// /workspace, with the environment the policy rebuilds, streaming its
// stdin, stdout and stderr. A refused command is an error with reason
// CommandRefused and nothing runs. When ctx ends, the command is killed.
func (r *Runtime) Exec(ctx context.Context, name string, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	const op = "running a command in"
	cl, inst, _, err := r.locate(ctx, name)
	if err != nil {
		return runtimes.ExitStatus{}, r.fail(op, name, err)
	}
	if inst == nil || inst.Config[KeyOwner] == "" {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonNotFound, op, name, "no instance of that name was made by this controller")
	}
	if inst.Status != incusapi.StatusRunning {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonNotFound, op, name, "the instance is %s, not running", strings.ToLower(inst.Status))
	}
	in, err := decodeInstance(inst)
	if err != nil {
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonFailed, op, name, "%w", err)
	}
	env, err := r.prepare(in, req)
	if err != nil {
		return runtimes.ExitStatus{}, &runtimes.Error{Reason: runtimes.ReasonRefused, Op: op, Name: name, Err: err}
	}
	// The identity is the one the instance was converged to: the one its
	// raw.idmap maps. One recorded before agents had their own has none,
	// and runs nothing until it is converged again.
	id, err := agentIdentity(in)
	if err != nil {
		return runtimes.ExitStatus{}, &runtimes.Error{Reason: runtimes.ReasonRefused, Op: op, Name: name, Err: fmt.Errorf("%w: %w", policy.ErrRefused, err)}
	}
	stdout, stderr := runtimes.OutputWriters(req.Stdout, req.Stderr)
	code, err := cl.Exec(ctx, name, incusapi.ExecRequest{
		Command: req.Argv,
		Env:     env,
		User:    id.UID,
		Group:   id.GID,
		Cwd:     policy.SandboxHome,
		Stdin:   req.Stdin,
		Stdout:  stdout,
		Stderr:  stderr,
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return runtimes.ExitStatus{Code: code}, fmt.Errorf("%s %s: %w", op, name, err)
		}
		if code >= 0 {
			// The command ran to its end; only its output was cut short.
			return runtimes.ExitStatus{Code: code}, r.fail(op, name, err)
		}
		return runtimes.ExitStatus{}, r.fail(op, name, err)
	}
	return runtimes.ExitStatus{Code: code}, nil
}

// prepare applies the policy: the allowlist and argv checks, and the
// environment rebuilt from nothing (locale, workspace/.env, passthrough
// names, minimal PATH, HOME=/workspace).
func (r *Runtime) prepare(in runtimes.Instance, req runtimes.ExecRequest) (map[string]string, error) {
	if len(req.Env) > 0 {
		return nil, fmt.Errorf("%w: the request carries environment variables; the environment is rebuilt by the sandbox policy from the passthrough list, workspace/%s and the locale, never taken from a request", policy.ErrRefused, policy.DotEnvFile)
	}
	if err := policy.CheckArgv(in.Binaries, req.Argv); err != nil {
		return nil, err
	}
	dotEnv, err := in.DotEnv()
	if err != nil {
		return nil, err
	}
	list, err := policy.BuildEnv(policy.EnvSources{Passthrough: in.Env, Lookup: r.cfg.LookupEnv, DotEnv: dotEnv, Proxy: in.ProxyURL()})
	if err != nil {
		return nil, err
	}
	env := make(map[string]string, len(list))
	for _, kv := range list {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env, nil
}
