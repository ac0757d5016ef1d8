// Package mcpserver serves one sandbox as Model Context Protocol tools, so
// an agent harness that speaks MCP uses the sandbox with one line of
// configuration: exec (the seed's exec tool: argv, never a shell), and
// read_file, write_file, list_directory and remove on the sandbox's areas
// and mounts. Every tool's description says what this sandbox offers (the
// allowed binaries, the areas and mounts with their modes), and a refusal
// is a tool error in the policy's own words, so the model learns why.
//
// The tools act through a Sandbox: sandboxctl's in-process runtime and
// file view, or a claim's exec API. The protocol is the official MCP Go
// SDK's.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Sandbox is what the tools act on.
type Sandbox interface {
	// Exec runs one command; a refusal is an error whose reason is
	// runtimes.ReasonRefused.
	Exec(ctx context.Context, req runtimes.ExecRequest) (runtimes.ExitStatus, error)
	// Files is the sandbox's file view (areas and mounts), acting as the
	// agent.
	Files() (Files, error)
	// Describe says what the sandbox offers, for the tools' descriptions.
	Describe() Description
}

// Files are the file operations of the tools, on paths as the sandbox
// sees them.
type Files interface {
	// Read reads at most max bytes of a regular file; more says the file
	// holds more.
	Read(path string, max int) (data []byte, more bool, err error)
	Write(path string, data []byte) error
	// List describes at most max entries of a directory, sorted by name,
	// and says whether it holds more.
	List(path string, max int) (entries []areas.Entry, more bool, err error)
	Remove(path string, recursive bool) error
}

// Description is what a sandbox offers an agent.
type Description struct {
	// Name names the sandbox (agent or claim) in the server's identity.
	Name     string
	Binaries []string
	// Places are the areas and mounts: path inside, and mode.
	Places []Place
	// Worktree is the claim's git worktree inside the sandbox, if any.
	Worktree string
}

// Place is one area or mount.
type Place struct {
	Path string
	Mode string // ro, rw or overlay
}

// DescribeInstance is the description of a runtime instance.
func DescribeInstance(name string, in runtimes.Instance) Description {
	d := Description{Name: name, Binaries: append([]string(nil), in.Binaries...)}
	for _, b := range append(append([]runtimes.Bind(nil), in.Areas...), in.Mounts...) {
		if b.GitDir {
			continue
		}
		mode := "rw"
		switch {
		case b.Overlay != nil:
			mode = "overlay"
		case b.ReadOnly:
			mode = "ro"
		}
		d.Places = append(d.Places, Place{Path: b.Target, Mode: mode})
	}
	sort.Slice(d.Places, func(i, j int) bool { return d.Places[i].Path < d.Places[j].Path })
	return d
}

// Limits of the exec and read_file tools. What a command prints and what
// a file holds are the agent's to choose, and an answer costs the server
// many times its bytes (JSON escapes a control byte as six, and the SDK
// sends a result both as structured content and as its text): an answer
// is bounded to what a model can use.
const (
	DefaultTimeout   = 120 * time.Second
	MaxTimeout       = 30 * time.Minute
	DefaultMaxOutput = 64 << 10
	MaxOutput        = 1 << 20
	DefaultReadBytes = 256 << 10
	MaxReadBytes     = 1 << 20
	// MaxListEntries bounds list_directory's answer: a name is up to 255
	// bytes, each of which may be a control byte, so the answer stays
	// within what read_file answers by default.
	MaxListEntries = 1000
)

// ExecInput is the exec tool's input.
type ExecInput struct {
	Argv           []string `json:"argv" jsonschema:"the command and its arguments, one string each; no shell is involved"`
	Stdin          string   `json:"stdin,omitempty" jsonschema:"text given to the command's standard input"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"seconds before the command is killed (default 120, at most 1800)"`
	MaxOutputBytes int      `json:"max_output_bytes,omitempty" jsonschema:"bytes kept of each of stdout and stderr (default 65536, at most 1048576)"`
}

// ExecOutput is the exec tool's result.
type ExecOutput struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// Truncated says that output beyond max_output_bytes was dropped.
	Truncated bool `json:"truncated"`
}

// PathInput names one path inside the sandbox.
type PathInput struct {
	Path string `json:"path" jsonschema:"an absolute path inside the sandbox"`
}

// ReadInput is read_file's input.
type ReadInput struct {
	Path     string `json:"path" jsonschema:"an absolute path inside the sandbox"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"bytes read from the file's start (default 262144, at most 1048576); truncated says the file holds more"`
}

// WriteInput is write_file's input.
type WriteInput struct {
	Path    string `json:"path" jsonschema:"an absolute path inside the sandbox; the file is replaced whole"`
	Content string `json:"content" jsonschema:"the file's new content, as text"`
}

// RemoveInput is remove's input.
type RemoveInput struct {
	Path      string `json:"path" jsonschema:"an absolute path inside the sandbox"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"remove a directory and everything in it"`
}

// FileOutput is read_file's result.
type FileOutput struct {
	Content string `json:"content"`
	// Truncated says the file holds more than max_bytes.
	Truncated bool `json:"truncated"`
}

// ListOutput is list_directory's result.
type ListOutput struct {
	Entries []ListEntry `json:"entries"`
	// Truncated says the directory holds more than MaxListEntries entries.
	Truncated bool `json:"truncated"`
}

// ListEntry is one entry of a directory.
type ListEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size"`
}

// Done is the result of a tool that only acts.
type Done struct {
	Done bool `json:"done"`
}

// New is the MCP server of one sandbox.
func New(sb Sandbox, version string) *mcp.Server {
	d := sb.Describe()
	s := mcp.NewServer(&mcp.Implementation{Name: "sandbox-" + d.Name, Version: version}, &mcp.ServerOptions{
		Instructions: "Tools of one least-privilege sandbox. " + offers(d),
	})
	t := tools{sb: sb}
	mcp.AddTool(s, &mcp.Tool{Name: "exec", Description: "Run one command in the sandbox and return its exit code, stdout and stderr. " +
		"The command is an argv array, not a shell line: to use shell syntax, run a shell that is allowed with -c. " + offers(d)}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a text file inside the sandbox: its first 256 KiB, or max_bytes up to 1 MiB; truncated says it holds more (read further parts with a command such as tail or sed through exec). " + places(d)}, t.read)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write a whole file inside the sandbox, creating it (and its missing directories) or replacing it atomically; read-only places refuse. " + places(d)}, t.write)
	mcp.AddTool(s, &mcp.Tool{Name: "list_directory", Description: "List a directory inside the sandbox: at most 1000 entries; truncated says it holds more (list further with a command such as ls or find through exec). " + places(d)}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "remove", Description: "Remove a file, or a directory with recursive; read-only places and the places themselves refuse. " + places(d)}, t.remove)
	if d.Worktree != "" {
		mcp.AddTool(s, &mcp.Tool{Name: "git_status", Description: "The state of this session's git worktree, " + d.Worktree +
			": its branch and the files changed, staged or untracked (git status --short --branch). Needs git among the allowed commands."}, t.gitStatus)
		mcp.AddTool(s, &mcp.Tool{Name: "git_diff", Description: "The uncommitted changes of this session's git worktree, " + d.Worktree +
			", as a unified diff (git diff; with staged, git diff --staged), optionally of one path. Needs git among the allowed commands."}, t.gitDiff)
	}
	return s
}

// GitDiffInput is git_diff's input.
type GitDiffInput struct {
	Staged bool   `json:"staged,omitempty" jsonschema:"the changes staged for the next commit instead of those not staged"`
	Path   string `json:"path,omitempty" jsonschema:"only this path, relative to the worktree"`
}

// GitOutput is the git tools' result.
type GitOutput struct {
	Output    string `json:"output"`
	Truncated bool   `json:"truncated"`
}

// git runs git in the worktree through the sandbox, as exec would.
func (t tools) git(ctx context.Context, args ...string) (*mcp.CallToolResult, GitOutput, error) {
	wt := t.sb.Describe().Worktree
	out, errb := &capped{max: MaxOutput}, &capped{max: DefaultMaxOutput}
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	st, err := t.sb.Exec(ctx, runtimes.ExecRequest{Argv: append([]string{"git", "-C", wt}, args...), Stdout: out, Stderr: errb})
	if err != nil {
		return nil, GitOutput{}, refusal(err)
	}
	if st.Code != 0 {
		return nil, GitOutput{}, fmt.Errorf("git %s in %s exited %d: %s", strings.Join(args, " "), wt, st.Code, errb.String())
	}
	return nil, GitOutput{Output: out.String(), Truncated: out.cut}, nil
}

func (t tools) gitStatus(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, GitOutput, error) {
	return t.git(ctx, "status", "--short", "--branch")
}

func (t tools) gitDiff(ctx context.Context, _ *mcp.CallToolRequest, in GitDiffInput) (*mcp.CallToolResult, GitOutput, error) {
	args := []string{"diff"}
	if in.Staged {
		args = append(args, "--staged")
	}
	if in.Path != "" {
		args = append(args, "--", in.Path)
	}
	return t.git(ctx, args...)
}

// offers says what the sandbox offers, for the model.
func offers(d Description) string {
	b := "No commands are allowed."
	if len(d.Binaries) > 0 {
		b = "Allowed commands: " + strings.Join(d.Binaries, ", ") + "; any other is refused."
	}
	return b + " " + places(d)
}

func places(d Description) string {
	var ps []string
	for _, p := range d.Places {
		ps = append(ps, p.Path+" ("+p.Mode+")")
	}
	s := "Files live in: " + strings.Join(ps, ", ") + "; nothing else of the host is visible."
	if d.Worktree != "" {
		s += " The git worktree of this session is " + d.Worktree + "."
	}
	return s
}

type tools struct{ sb Sandbox }

func (t tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	if len(in.Argv) == 0 || in.Argv[0] == "" {
		return nil, ExecOutput{}, errors.New("argv: give the command and its arguments, the command first")
	}
	timeout := DefaultTimeout
	if in.TimeoutSeconds > 0 {
		timeout = min(time.Duration(in.TimeoutSeconds)*time.Second, MaxTimeout)
	}
	max := DefaultMaxOutput
	if in.MaxOutputBytes > 0 {
		max = min(in.MaxOutputBytes, MaxOutput)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stdout, stderr := &capped{max: max}, &capped{max: max}
	req := runtimes.ExecRequest{Argv: in.Argv, Stdout: stdout, Stderr: stderr}
	if in.Stdin != "" {
		req.Stdin = strings.NewReader(in.Stdin)
	}
	st, err := t.sb.Exec(ctx, req)
	if ctx.Err() == context.DeadlineExceeded {
		return nil, ExecOutput{}, fmt.Errorf("the command was killed after %s (timeout_seconds); output so far: %s%s", timeout, stdout.String(), stderr.String())
	}
	if err != nil {
		return nil, ExecOutput{}, refusal(err)
	}
	return nil, ExecOutput{ExitCode: st.Code, Stdout: stdout.String(), Stderr: stderr.String(), Truncated: stdout.cut || stderr.cut}, nil
}

// refusal is a failed exec as the model should read it.
func refusal(err error) error {
	if runtimes.ReasonOf(err) == runtimes.ReasonRefused {
		return fmt.Errorf("refused by the sandbox's policy: %w", err)
	}
	return err
}

func (t tools) read(_ context.Context, _ *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, FileOutput, error) {
	max := DefaultReadBytes
	if in.MaxBytes > 0 {
		max = min(in.MaxBytes, MaxReadBytes)
	}
	f, err := t.sb.Files()
	if err != nil {
		return nil, FileOutput{}, err
	}
	b, more, err := f.Read(in.Path, max)
	if err != nil {
		return nil, FileOutput{}, err
	}
	return nil, FileOutput{Content: string(b), Truncated: more}, nil
}

func (t tools) write(_ context.Context, _ *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, Done, error) {
	f, err := t.sb.Files()
	if err != nil {
		return nil, Done{}, err
	}
	if err := f.Write(in.Path, []byte(in.Content)); err != nil {
		return nil, Done{}, err
	}
	return nil, Done{Done: true}, nil
}

func (t tools) list(_ context.Context, _ *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, ListOutput, error) {
	f, err := t.sb.Files()
	if err != nil {
		return nil, ListOutput{}, err
	}
	es, more, err := f.List(in.Path, MaxListEntries)
	if err != nil {
		return nil, ListOutput{}, err
	}
	out := ListOutput{Entries: []ListEntry{}, Truncated: more}
	for _, e := range es {
		out.Entries = append(out.Entries, ListEntry{Name: e.Name, Type: string(e.Type), Size: e.Size})
	}
	return nil, out, nil
}

func (t tools) remove(_ context.Context, _ *mcp.CallToolRequest, in RemoveInput) (*mcp.CallToolResult, Done, error) {
	f, err := t.sb.Files()
	if err != nil {
		return nil, Done{}, err
	}
	if err := f.Remove(in.Path, in.Recursive); err != nil {
		return nil, Done{}, err
	}
	return nil, Done{Done: true}, nil
}

// capped keeps the first max bytes written and says whether more came.
type capped struct {
	max int
	buf strings.Builder
	cut bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.cut = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	c.buf.Write(p)
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }

var _ io.Writer = (*capped)(nil)

// ViewFiles are Files on a file view (internal/areas), for a sandbox on
// this host.
type ViewFiles struct{ View *areas.View }

// Read implements Files: only what it returns is read.
func (v ViewFiles) Read(path string, max int) ([]byte, bool, error) {
	r, rel, err := v.View.Resolve(path)
	if err != nil {
		return nil, false, err
	}
	f, err := r.Open(rel)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > max {
		return b[:max], true, nil
	}
	return b, false, nil
}

// Write implements Files; missing parent directories are made.
func (v ViewFiles) Write(path string, data []byte) error {
	r, rel, err := v.View.Resolve(path)
	if err != nil {
		return err
	}
	if dir := filepath.Dir(rel); dir != "." && dir != "" {
		if err := r.Mkdir(dir, true); err != nil {
			return err
		}
	}
	return r.Write(rel, data, 0o644)
}

// List implements Files.
// What it holds at once is max entries and a batch, however many the
// directory has: the entries given are the first in the directory's
// order, not the first by name.
func (v ViewFiles) List(path string, max int) ([]areas.Entry, bool, error) {
	r, rel, err := v.View.Resolve(path)
	if err != nil {
		return nil, false, err
	}
	var out []areas.Entry
	more := false
	errEnough := errors.New("enough")
	err = r.Each(rel, areas.MaxListEntries, func(batch []areas.Entry) error {
		if room := max - len(out); len(batch) > room {
			out, more = append(out, batch[:room]...), true
			return errEnough
		}
		out = append(out, batch...)
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, false, err
	}
	slices.SortFunc(out, func(a, b areas.Entry) int { return strings.Compare(a.Name, b.Name) })
	return out, more, nil
}

// Remove implements Files.
func (v ViewFiles) Remove(path string, recursive bool) error {
	return v.View.Remove(path, recursive)
}
