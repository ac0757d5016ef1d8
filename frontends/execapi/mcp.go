package execapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cireilclaw/sandbox-controller/frontends/mcpserver"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// mcpVersion is what the claims' MCP servers call themselves.
const mcpVersion = "v1alpha1"

// serveMCP serves a claim's sandbox as MCP tools over streamable HTTP:
// the same authentication as exec and files, and the caller must be
// allowed both to exec (create sessionclaims/exec) and to change files
// (update sessionclaims/files), since the tools do both. Each request is
// answered on its own (stateless), so any node's API, or the API server in
// front of them, can take the next one.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	u, how := s.authenticate(w, r)
	if u == nil || !s.authorize(w, r, u, "create", subresourceExec, ns, name) || !s.authorize(w, r, u, "update", subresourceFiles, ns, name) {
		return
	}
	t, ok := s.claimTarget(w, r, u, how, ns, name, true)
	if !ok {
		return
	}
	if aerr := oneMessage(w, r); aerr != nil {
		s.refuse(w, r, u, aerr)
		return
	}
	d := mcpserver.DescribeInstance(ns+"-"+name, t.instance)
	if w := t.claim.Status.Worktree; w != nil {
		d.Worktree = w.Path
	}
	server := mcpserver.New(&claimSandbox{s: s, t: t, key: ns + "/" + name, d: d}, mcpVersion)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	h.ServeHTTP(w, r)
}

// oneMessage refuses a JSON-RPC batch. The SDK still takes batches from a
// client that names an old protocol version (or none), runs their calls
// at once and holds every answer until the last is done: a batch of a few
// thousand read_file calls, a few hundred kilobytes of body, would make
// the controller hold and send gigabytes. A request is one message, so one
// tool call, bounded as one. The body is bounded as the SDK bounds it,
// and whitespace before the message is skipped.
func oneMessage(w http.ResponseWriter, r *http.Request) *apiError {
	body := http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes)
	br := bufio.NewReader(body)
	for {
		b, err := br.ReadByte()
		if err != nil {
			// An empty or broken body is the SDK's to answer.
			break
		}
		if b == ' ' || b == '\t' || b == '\n' || b == '\r' {
			continue
		}
		_ = br.UnreadByte()
		if b == '[' {
			return &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: "a JSON-RPC batch is refused: send one message a request"}
		}
		break
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{br, body}
	return nil
}

// claimSandbox is a claim's sandbox as the MCP tools use it: commands
// checked against the allowlist and counted against the claim's limit of
// concurrent commands, as exec's are; files through its file view.
type claimSandbox struct {
	s   *Server
	t   *target
	key string
	d   mcpserver.Description
}

func (c *claimSandbox) Exec(ctx context.Context, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	if err := policy.CheckArgv(c.t.instance.Binaries, req.Argv); err != nil {
		c.s.metrics.execs.WithLabelValues(outcomeRefused).Inc()
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonRefused, "running a command in", c.t.instance.Name, "%w", err)
	}
	if !c.s.execs.acquire(c.key) {
		return runtimes.ExitStatus{}, fmt.Errorf("SessionClaim %s already runs %d commands, the most one claim may run at once", c.key, c.s.cfg.MaxExecsPerClaim)
	}
	defer c.s.execs.release(c.key)
	ctx, cancel := context.WithTimeout(ctx, c.s.cfg.ExecTimeout)
	defer cancel()
	st, err := c.t.runtime.Exec(ctx, c.t.instance.Name, req)
	outcome := outcomeExited
	if err != nil {
		outcome = outcomeFailed
		if runtimes.ReasonOf(err) == runtimes.ReasonRefused {
			outcome = outcomeRefused
		}
	}
	c.s.metrics.execs.WithLabelValues(outcome).Inc()
	return st, err
}

func (c *claimSandbox) Files() (mcpserver.Files, error) {
	v, err := c.t.instance.FileView()
	if err != nil {
		c.s.log.Info("opening a claim's areas failed", "claim", c.key, "error", err.Error())
		return nil, errAreasUnavailable(c.key, err)
	}
	return claimFiles{c: c, Files: mcpserver.ViewFiles{View: v}}, nil
}

// claimFiles are a claim's file tools, each counted against the claim's
// limit of concurrent commands while it runs: a file tool holds memory and
// descriptors of the server as a command does.
type claimFiles struct {
	c *claimSandbox
	mcpserver.Files
}

func (f claimFiles) slot() (func(), error) {
	if !f.c.s.execs.acquire(f.c.key) {
		return nil, fmt.Errorf("SessionClaim %s already runs %d commands and file tools, the most one claim may run at once", f.c.key, f.c.s.cfg.MaxExecsPerClaim)
	}
	return func() { f.c.s.execs.release(f.c.key) }, nil
}

func (f claimFiles) Read(path string, max int) ([]byte, bool, error) {
	done, err := f.slot()
	if err != nil {
		return nil, false, err
	}
	defer done()
	return f.Files.Read(path, max)
}

func (f claimFiles) Write(path string, data []byte) error {
	done, err := f.slot()
	if err != nil {
		return err
	}
	defer done()
	return f.Files.Write(path, data)
}

func (f claimFiles) List(path string) ([]areas.Entry, error) {
	done, err := f.slot()
	if err != nil {
		return nil, err
	}
	defer done()
	return f.Files.List(path)
}

func (f claimFiles) Remove(path string, recursive bool) error {
	done, err := f.slot()
	if err != nil {
		return err
	}
	defer done()
	return f.Files.Remove(path, recursive)
}

func (c *claimSandbox) Describe() mcpserver.Description { return c.d }
