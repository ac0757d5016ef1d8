// Command sandboxctl runs commands in an agent's sandbox straight from a
// sandbox.toml, with no cluster, and converts the file to a Sandbox
// manifest for one. It is a thin shell over frontends/sandboxtoml and the
// bwrap driver: every rule it applies lives there, and it must never run a
// command the policy refused or fall back to running without the sandbox
// because of a configuration error.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/frontends/sandboxtoml"
	"github.com/cireilclaw/sandbox-controller/internal/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

// Exit codes of sandboxctl itself; any other code is the command's.
const (
	exitUsage   = 2
	exitFailed  = 125 // sandboxctl could not run the command
	exitRefused = 126 // the policy refused the command; nothing ran
)

const usage = `sandboxctl runs commands in an agent's least-privilege sandbox, configured
by a sandbox.toml, without a cluster.

Usage:
  sandboxctl run     --config FILE --agent NAME [--areas-root DIR] -- COMMAND [ARG...]
  sandboxctl serve   --config FILE --agent NAME [--areas-root DIR]
  sandboxctl convert FILE --agent NAME [--name NAME] [--namespace NS]
  sandboxctl ls      --config FILE --agent NAME [--areas-root DIR] [SANDBOX_PATH]
  sandboxctl cp      --config FILE --agent NAME [--areas-root DIR] SRC DST
  sandboxctl cp      [-n NS] [--via api-server|node] [--server URL] [--api-ca-file F] SRC DST   (one side CLAIM:/path)
  sandboxctl exec    [-n NS] [-i] [--via api-server|node] [--server URL] [--api-ca-file F] CLAIM -- COMMAND [ARG...]
  sandboxctl diff    --config FILE --agent NAME [--areas-root DIR] TARGET
  sandboxctl apply   --config FILE --agent NAME [--areas-root DIR] --digest D TARGET
  sandboxctl repair  --config FILE --agent NAME [--areas-root DIR]

run      runs one command in the sandbox and exits with its exit code; its
         stdin, stdout and stderr are the command's. A refused command runs
         nothing, prints the reason and exits 126; a sandboxctl failure
         exits 125.
serve    reads one command a line from stdin as a JSON array of strings
         (["git","status"]) and answers each with one JSON line
         {"exit":0,"stdout":"...","stderr":"...","error":"..."}. It watches
         the configuration file: a valid change applies to the next
         command; an invalid one is reported on stderr and the last good
         configuration stays in force.
convert  prints the Sandbox manifest for kubectl apply.
ls       lists a directory of the sandbox (default /workspace).
cp       copies one file in or out; the sandbox side is written with a
         leading ':' (sandboxctl cp notes.txt :/workspace/), or, for a
         SessionClaim's sandbox through the exec API, as CLAIM:/path
         (kubectl sandbox cp notes.txt alice-session-1:/workspace/). Every access
         inside the sandbox is contained: a symbolic link that leaves its
         area or mount is refused.
exec     runs a command in a SessionClaim's sandbox through the controller's
         exec API (also installed as the kubectl plugin: kubectl sandbox
         exec CLAIM -- git status). By default through the API server when
         it serves the aggregated API, with the kubeconfig as it is (--via
         api-server); else, or with --via node, on the Sandbox's node, where
         it sends the kubeconfig's client certificate, or a token for the
         exec API's audience: a service account token is exchanged for one
         (TokenRequest), others are never forwarded (--api-token-file
         gives one).
diff     lists what the sandbox changed in an overlay mount (mode =
         "overlay"): A added, M changed, D deleted, with each file's mode
         and SHA-256, relative to the mount, and a digest of the whole set.
apply    writes those changes to the mount's host source, only if they still
         have the digest given with --digest; otherwise it changes nothing.
mcp      serves the agent's sandbox (--agent) or a SessionClaim's (kubectl
         sandbox mcp CLAIM, through the claim's exec API) as Model Context
         Protocol tools on stdin and stdout (exec, read_file, write_file,
         list_directory, remove), for an agent harness that starts it as a
         local process.
repair   moves aside (renames to NAME.blocked-TIME, deleting nothing) each
         symbolic link or file the agent left on the way to a custom mount's
         destination in its workspace: with one there no sandbox can be
         built, so run refuses every command until it is gone.

The configuration file is optional: a missing file means the bwrap backend
with no mounts and no allowed binaries. Agent areas live in
<areas-root>/<agent>/{workspace,memories,blocks,skills,tasks} and are
created when missing.

Run "sandboxctl COMMAND -h" for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return runCommand(args[1:], stdin, stdout, stderr)
	case "serve":
		return serve(args[1:], stdin, stdout, stderr)
	case "convert":
		return convert(args[1:], stdout, stderr)
	case "ls":
		return listFiles(args[1:], stdout, stderr)
	case "cp":
		return copyFiles(args[1:], stdout, stderr)
	case "exec":
		return execCommand(args[1:], stdin, stdout, stderr)
	case "diff", "apply":
		return overlayCommand(args[0], args[1:], stdout, stderr)
	case "repair":
		return repair(args[1:], stdout, stderr)
	case "mcp":
		return serveMCP(args[1:], stdin, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "sandboxctl: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

// sandboxFlags are the flags run and serve share.
type sandboxFlags struct {
	config    string
	agent     string
	areasRoot string
	stateDir  string
	// allowUnlimited runs commands without resource limits where no
	// cgroup can be made, loudly.
	allowUnlimited bool
}

func (f *sandboxFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "config/sandbox.toml", "the sandbox.toml to use; a missing file means the defaults")
	fs.StringVar(&f.agent, "agent", "", "the agent's name (a DNS-1123 label); required")
	fs.StringVar(&f.areasRoot, "areas-root", defaultAreasRoot(), "the directory holding one directory of areas per agent")
	fs.StringVar(&f.stateDir, "state-dir", "", "where the driver records instances (default <areas-root>/.sandboxctl)")
	fs.BoolVar(&f.allowUnlimited, "allow-unlimited", false, "where no cgroup can be made for the [limits] (not root, no delegated cgroup v2 subtree), run commands WITHOUT resource limits, with a warning, instead of refusing them")
}

func defaultAreasRoot() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "cireilclaw", "agents")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "cireilclaw", "agents")
	}
	return ""
}

// parseAnywhere parses flags wherever they stand among the arguments, as
// kubectl does (cp notes.txt claim:/workspace/ -n team), up to "--": what
// follows it is left as it is. fs.Args() is then the positional
// arguments; "--" stays among them only after a positional one, where the
// flag package would have left it too.
func parseAnywhere(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			if len(positional) > 0 {
				positional = append(positional, "--")
			}
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sandboxctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sandboxctl %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// runner builds the bwrap driver and a runner over src; the driver's
// warnings (the sandbox disabled) go to warnings.
func (f *sandboxFlags) runner(src sandboxtoml.Source, warnings io.Writer) (*sandboxtoml.Runner, error) {
	root, err := filepath.Abs(f.areasRoot)
	if err != nil || f.areasRoot == "" {
		return nil, fmt.Errorf("areas root %q: give an absolute directory with --areas-root", f.areasRoot)
	}
	state := f.stateDir
	if state == "" {
		// Beside the agents' directories, never inside one: an agent name
		// cannot begin with a dot.
		state = filepath.Join(root, ".sandboxctl")
	}
	if state, err = filepath.Abs(state); err != nil {
		return nil, fmt.Errorf("state directory %q: %w", f.stateDir, err)
	}
	rt, err := bwrap.New(bwrap.Config{StateDir: state, Warnings: warnings, AllowUnlimited: f.allowUnlimited})
	if err != nil {
		return nil, err
	}
	home, _ := os.UserHomeDir()
	return sandboxtoml.NewRunner(src, rt, v1alpha1.BackendBwrap, instance.Host{AreasRoot: root, Home: home}), nil
}

// staticRunner is the runner of the agent's sandbox as the configuration
// file says now.
func (f *sandboxFlags) staticRunner(warnings io.Writer) (*sandboxtoml.Runner, error) {
	spec, err := sandboxtoml.Load(f.config, f.agent)
	if err != nil {
		return nil, err
	}
	return f.runner(sandboxtoml.Static{Spec: spec}, warnings)
}

// closeRunner stops the runner's instance, saying so when that fails.
func closeRunner(r *sandboxtoml.Runner, stderr io.Writer) {
	if err := r.Close(context.Background()); err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
	}
}

func runCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f sandboxFlags
	fs := newFlagSet("run", "run --config FILE --agent NAME [--areas-root DIR] -- COMMAND [ARG...]", stderr)
	f.register(fs)
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	argv := fs.Args()
	if f.agent == "" || len(argv) == 0 {
		fmt.Fprintln(stderr, "sandboxctl run: --agent and a command after -- are required")
		fs.Usage()
		return exitUsage
	}
	r, err := f.staticRunner(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer closeRunner(r, stderr)
	st, err := r.Exec(ctx, runtimes.ExecRequest{Argv: argv, Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		fmt.Fprint(stderr, repairHint(err, &f))
		if runtimes.ReasonOf(err) == runtimes.ReasonRefused {
			return exitRefused
		}
		return exitFailed
	}
	return st.Code
}

// response is serve's answer to one command.
type response struct {
	Exit   int    `json:"exit"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Error is set when the command did not run: refused, or a failure of
	// sandboxctl; Refused tells the two apart.
	Error   string `json:"error,omitempty"`
	Refused bool   `json:"refused,omitempty"`
}

func serve(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f sandboxFlags
	fs := newFlagSet("serve", "serve --config FILE --agent NAME [--areas-root DIR]", stderr)
	f.register(fs)
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if f.agent == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "sandboxctl serve: --agent is required and takes no arguments")
		fs.Usage()
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "sandboxctl: "+format+"\n", a...) }
	w, err := sandboxtoml.Watch(ctx, f.config, f.agent, sandboxtoml.WatchOptions{
		OnReload: func(s sandboxtoml.Snapshot) {
			logf("%s: configuration generation %d in force from the next command", f.config, s.Generation)
		},
		OnError: func(err error) { logf("%v", err) },
	})
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	defer w.Close()
	r, err := f.runner(w, stderr)
	if err == nil {
		defer func() {
			if err := r.Close(context.Background()); err != nil {
				fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
			}
		}()
	}
	if err != nil {
		logf("%v", err)
		return exitFailed
	}

	enc := json.NewEncoder(stdout)
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var resp response
		var argv []string
		if err := json.Unmarshal([]byte(line), &argv); err != nil {
			resp = response{Exit: exitUsage, Error: fmt.Sprintf("reading a command: want a JSON array of strings such as [\"git\",\"status\"]: %v", err)}
		} else {
			var out, errb bytes.Buffer
			st, err := r.Exec(ctx, runtimes.ExecRequest{Argv: argv, Stdin: bytes.NewReader(nil), Stdout: &out, Stderr: &errb})
			resp = response{Exit: st.Code, Stdout: out.String(), Stderr: errb.String()}
			if err != nil {
				resp.Error = err.Error()
				resp.Refused = runtimes.ReasonOf(err) == runtimes.ReasonRefused
				resp.Exit = exitFailed
				if resp.Refused {
					resp.Exit = exitRefused
				}
			}
		}
		if err := enc.Encode(resp); err != nil {
			logf("writing a response: %v", err)
			return exitFailed
		}
		if ctx.Err() != nil {
			return exitFailed
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		logf("reading commands: %v", err)
		return exitFailed
	}
	return 0
}

func convert(args []string, stdout, stderr io.Writer) int {
	var agent, name, namespace string
	fs := newFlagSet("convert", "convert FILE --agent NAME [--name NAME] [--namespace NS]", stderr)
	fs.StringVar(&agent, "agent", "", "the agent's name (a DNS-1123 label); required")
	fs.StringVar(&name, "name", "", "the Sandbox's name (default the agent's name)")
	fs.StringVar(&namespace, "namespace", "", "the Sandbox's namespace (default: left to kubectl)")
	// The file comes first in the synopsis; flag stops at it, so the flags
	// after it are parsed in a second pass.
	var file string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		file, args = args[0], args[1:]
	}
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if file == "" && fs.NArg() == 1 {
		file = fs.Arg(0)
	} else if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "sandboxctl convert: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if file == "" || agent == "" {
		fmt.Fprintln(stderr, "sandboxctl convert: a FILE and --agent are required")
		fs.Usage()
		return exitUsage
	}
	spec, err := sandboxtoml.Load(file, agent)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	out, err := sandboxtoml.Manifest(spec, name, namespace)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	stdout.Write(out)
	return 0
}
