package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cireilclaw/sandbox-controller/frontends/mcpserver"
	"github.com/cireilclaw/sandbox-controller/frontends/sandboxtoml"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// version is what the MCP server calls itself.
const version = "v1alpha1"

// localSandbox is an agent's sandbox on this host, for the MCP server:
// commands through the same runner as run, files through the agent's
// file view, acting as the agent.
type localSandbox struct {
	agent  string
	runner *sandboxtoml.Runner
	in     runtimes.Instance
}

func (l *localSandbox) Exec(ctx context.Context, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	return l.runner.Exec(ctx, req)
}

func (l *localSandbox) Files() (mcpserver.Files, error) {
	v, err := l.in.FileView()
	if err != nil {
		return nil, err
	}
	return mcpserver.ViewFiles{View: v}, nil
}

func (l *localSandbox) Describe() mcpserver.Description {
	return mcpserver.DescribeInstance(l.agent, l.in)
}

// serveMCP serves the agent's sandbox as MCP tools on stdin and stdout,
// for an agent harness that starts it as a local process.
func serveMCP(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f sandboxFlags
	fs := newFlagSet("mcp", "mcp --config FILE --agent NAME [--areas-root DIR]", stderr)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if f.agent == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "sandboxctl mcp: --agent is required, and nothing else after the flags")
		fs.Usage()
		return exitUsage
	}
	spec, err := sandboxtoml.Load(f.config, f.agent)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	in, err := f.instance()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	r, err := f.runner(sandboxtoml.Static{Spec: spec}, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := r.Close(context.Background()); err != nil {
			fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		}
	}()
	server := mcpserver.New(&localSandbox{agent: f.agent, runner: r, in: in}, version)
	t := &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
	if err := server.Run(ctx, t); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "sandboxctl mcp: %v\n", err)
		return exitFailed
	}
	return 0
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
