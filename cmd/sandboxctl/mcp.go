package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/client-go/rest"

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

// serveMCP serves a sandbox as MCP tools on stdin and stdout, for an
// agent harness that starts it as a local process: the agent's sandbox on
// this host (--agent), or a SessionClaim's (kubectl sandbox mcp CLAIM),
// whose tools the claim's exec API serves over streamable HTTP.
func serveMCP(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f sandboxFlags
	var cf clusterFlags
	fs := newFlagSet("mcp", "mcp --config FILE --agent NAME [--areas-root DIR] | mcp CLAIM [-n NAMESPACE] [--via api-server|node]", stderr)
	f.register(fs)
	cf.register(fs)
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if f.agent == "" && fs.NArg() == 1 {
		return bridgeMCP(cf, fs.Arg(0), stdin, stdout, stderr)
	}
	if f.agent == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "sandboxctl mcp: give --agent (a sandbox on this host) or one SessionClaim name, not both")
		fs.Usage()
		return exitUsage
	}
	in, err := f.instance()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	r, err := f.staticRunner(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer closeRunner(r, stderr)
	server := mcpserver.New(&localSandbox{agent: f.agent, runner: r, in: in}, version)
	t := &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
	if err := server.Run(ctx, t); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "sandboxctl mcp: %v\n", err)
		return exitFailed
	}
	return 0
}

// bridgeMCP serves a claim's tools on stdio: it connects to the claim's
// MCP endpoint with the kubeconfig's credentials (as exec does) and
// offers the same tools, each call forwarded.
func bridgeMCP(cf clusterFlags, claim string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	remote, err := connectClaimMCP(ctx, cf, claim)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl mcp: %v\n", err)
		return exitFailed
	}
	defer remote.Close()
	tools, err := remote.ListTools(ctx, nil)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl mcp: listing the tools of SessionClaim %s: %v\n", claim, err)
		return exitFailed
	}
	init := remote.InitializeResult()
	impl := &mcp.Implementation{Name: "sandbox-" + claim, Version: version}
	opts := &mcp.ServerOptions{}
	if init != nil {
		opts.Instructions = init.Instructions
	}
	server := mcp.NewServer(impl, opts)
	for _, tl := range tools.Tools {
		server.AddTool(tl, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return remote.CallTool(ctx, &mcp.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments})
		})
	}
	t := &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
	if err := server.Run(ctx, t); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "sandboxctl mcp: %v\n", err)
		return exitFailed
	}
	return 0
}

// connectClaimMCP connects to the MCP endpoint of the claim's exec API.
func connectClaimMCP(ctx context.Context, cf clusterFlags, claim string) (*mcp.ClientSession, error) {
	cfg, ns, base, err := cf.apiConfig(ctx, claim)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	endpoint := fmt.Sprintf("%s/namespaces/%s/sessionclaims/%s/mcp", base, url.PathEscape(ns), url.PathEscape(claim))
	client := mcp.NewClient(&mcp.Implementation{Name: "kubectl-sandbox", Version: version}, nil)
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to the tools of SessionClaim %s/%s: %w", ns, claim, err)
	}
	return s, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
