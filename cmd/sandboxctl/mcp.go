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
	"github.com/spf13/cobra"
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
func newMCPCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cf := newClusterFlags()
	cmd := c.verb(&cobra.Command{
		Use:   "mcp CLAIM [-n NS] | mcp --config FILE --agent NAME [--areas-root DIR]",
		Short: "Serve a sandbox as Model Context Protocol tools on stdin and stdout",
		Long: `mcp serves a SessionClaim's sandbox (through the claim's exec API, with the
kubeconfig's credentials) or the agent's sandbox on this host (--agent) as
Model Context Protocol tools on stdin and stdout: exec, read_file,
write_file, list_directory, remove, and git_status and git_diff for a claim
with a worktree. An agent harness starts it as a local process.`,
		Example: `  kubectl sandbox mcp alice-session-1 -n team-a
  sandboxctl mcp --config sandbox.toml --agent ada

  # a harness's MCP configuration
  {"mcpServers": {"sandbox": {"command": "kubectl",
    "args": ["sandbox", "mcp", "alice-session-1", "-n", "team-a"]}}}`,
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 || f.agent != "" {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return claimNames(cf, toComplete, "")
		},
	}, func(cmd *cobra.Command, args []string) int {
		if f.agent == "" && len(args) == 1 {
			return bridgeMCP(cf, args[0], c.stdin, c.stdout, c.stderr)
		}
		if f.agent == "" || len(args) != 0 {
			return usageError(cmd, "give --agent (a sandbox on this host) or one SessionClaim name, not both")
		}
		return serveMCP(&f, c.stdin, c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	cf.register(cmd.Flags())
	registerClusterCompletion(cmd, cf)
	return cmd
}

func serveMCP(f *sandboxFlags, stdin io.Reader, stdout, stderr io.Writer) int {
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
func bridgeMCP(cf *clusterFlags, claim string, stdin io.Reader, stdout, stderr io.Writer) int {
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
func connectClaimMCP(ctx context.Context, cf *clusterFlags, claim string) (*mcp.ClientSession, error) {
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
