package execapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

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
	if aerr := s.readMessage(w, r); aerr != nil {
		s.refuse(w, r, u, aerr)
		return
	}
	// The answer is held here until its client takes it, as a download's
	// is sent: it holds one of the namespace's download slots until then.
	// The claim's limit alone bounds nothing across claims, which a tenant
	// makes at will.
	if aerr := s.takeDownload(w, ns); aerr != nil {
		s.refuse(w, r, u, aerr)
		return
	}
	defer s.downloads.release(ns)
	d := mcpserver.DescribeInstance(ns+"-"+name, t.instance)
	if w := t.claim.Status.Worktree; w != nil {
		d.Worktree = w.Path
	}
	sb := &claimSandbox{s: s, t: t, key: ns + "/" + name, d: d}
	// The handler returns once the answer is sent: until then the answer
	// is in memory, and its tool's slot stays taken.
	defer sb.release()
	server := mcpserver.New(sb, mcpVersion)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	// Each write of the answer has a deadline, as a download's has: a
	// client that stops reading gives its tool's slot back then.
	h.ServeHTTP(deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: s.downloadWriteTimeout}, r)
}

// readMessage reads the request's body whole, as the SDK would, while it
// holds an upload slot of the namespace: a body is held in memory (up to
// the SDK's 4 MiB) as it arrives, and a caller that sends most of one and
// stalls would otherwise hold that memory as many times as it liked.
//
// A JSON-RPC batch is refused. The SDK still takes batches from a client
// that names an old protocol version (or none), runs their calls at once
// and holds every answer until the last is done: a batch of a few thousand
// read_file calls, a few hundred kilobytes of body, would make the
// controller hold and send gigabytes. A request is one message, so one
// tool call, bounded as one.
func (s *Server) readMessage(w http.ResponseWriter, r *http.Request) *apiError {
	ns := r.PathValue("namespace")
	if aerr := s.takeUpload(w, ns); aerr != nil {
		return aerr
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
	s.uploads.release(ns)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &apiError{code: http.StatusRequestEntityTooLarge, refusal: refusalBodyTooLarge, msg: fmt.Sprintf("the body is larger than the %d-byte limit of one MCP request", mbe.Limit)}
	case err != nil:
		return &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: fmt.Sprintf("reading the MCP request: %v", err)}
	}
	if first := bytes.TrimLeft(body, " \t\r\n"); len(first) > 0 && first[0] == '[' {
		return &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: "a JSON-RPC batch is refused: send one message a request"}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return nil
}

// claimSandbox is a claim's sandbox as the MCP tools of one request use
// it: commands checked against the allowlist, and every tool counted
// against the claim's limit of concurrent commands, as exec's are, from
// its start until the request's answer has been sent (release); files
// through its file view.
type claimSandbox struct {
	s   *Server
	t   *target
	key string
	d   mcpserver.Description

	mu       sync.Mutex
	held     int
	released bool
}

// take counts a tool against the claim's limit until release. A tool's
// answer (a megabyte of a file or of a command's output is about 13 MB of
// JSON) is held until its client takes it, so the slot is held as long:
// clients that do not read their answers hold no more of them than the
// claim may run commands.
func (c *claimSandbox) take() error {
	if !c.s.execs.acquire(c.key) {
		return fmt.Errorf("SessionClaim %s already runs %d commands and tools, the most one claim may run at once", c.key, c.s.cfg.MaxExecsPerClaim)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		// The request has ended: a slot taken now would never be given back.
		c.s.execs.release(c.key)
		return errors.New("the request has ended")
	}
	c.held++
	return nil
}

// release gives back every slot the request's tools took.
func (c *claimSandbox) release() {
	c.mu.Lock()
	n := c.held
	c.held, c.released = 0, true
	c.mu.Unlock()
	for range n {
		c.s.execs.release(c.key)
	}
}

func (c *claimSandbox) Exec(ctx context.Context, req runtimes.ExecRequest) (runtimes.ExitStatus, error) {
	if err := policy.CheckArgv(c.t.instance.Binaries, req.Argv); err != nil {
		c.s.metrics.execs.WithLabelValues(outcomeRefused).Inc()
		return runtimes.ExitStatus{}, runtimes.Errorf(runtimes.ReasonRefused, "running a command in", c.t.instance.Name, "%w", err)
	}
	if err := c.take(); err != nil {
		return runtimes.ExitStatus{}, err
	}
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
	if ctx.Err() != nil {
		// The tool says how long the command ran.
		return st, err
	}
	return st, c.s.hiddenRuntimeError("running a command in", c.key, c.t.instance.Name, err)
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
// limit of concurrent commands (take): a file tool holds memory and
// descriptors of the server as a command does.
type claimFiles struct {
	c *claimSandbox
	mcpserver.Files
}

func (f claimFiles) Read(path string, max int) ([]byte, bool, error) {
	if err := f.c.take(); err != nil {
		return nil, false, err
	}
	b, cut, err := f.Files.Read(path, max)
	return b, cut, f.failed(path, err)
}

func (f claimFiles) Write(path string, data []byte) error {
	if err := f.c.take(); err != nil {
		return err
	}
	return f.failed(path, f.Files.Write(path, data))
}

func (f claimFiles) List(path string, max int) ([]areas.Entry, bool, error) {
	if err := f.c.take(); err != nil {
		return nil, false, err
	}
	entries, more, err := f.Files.List(path, max)
	return entries, more, f.failed(path, err)
}

func (f claimFiles) Remove(path string, recursive bool) error {
	if err := f.c.take(); err != nil {
		return err
	}
	return f.failed(path, f.Files.Remove(path, recursive))
}

// failed is err of a file tool on path as the model reads it: the
// caller's mistakes and refusals as they are, what is no fault of its
// (the file API's 500) by hideFailure.
func (f claimFiles) failed(path string, err error) error {
	if err == nil {
		return nil
	}
	if e := f.c.s.fileError(f.c.key, path, err); e.code == http.StatusInternalServerError {
		return e
	}
	return err
}

func (c *claimSandbox) Describe() mcpserver.Description { return c.d }
