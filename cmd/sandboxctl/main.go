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
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/frontends/sandboxtoml"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

// Exit codes of sandboxctl itself; any other code is the command's.
const (
	exitUsage   = 2
	exitFailed  = 125 // sandboxctl could not run the command
	exitRefused = 126 // the policy refused the command; nothing ran
)

// sandboxFlags are the flags run and serve share.
type sandboxFlags struct {
	config    string
	agent     string
	areasRoot string
	stateDir  string
	// allowUnlimited runs commands without resource limits where no
	// cgroup can be made, loudly.
	allowUnlimited bool
	// oneShot says this process runs one command and ends with it (run):
	// on cgroup v1 its starting thread joins the command's cgroups for
	// the fork (bwrap.Config.JoinCgroupToStart).
	oneShot bool
	// trusted says config, areasRoot and stateDir were resolved and
	// checked by trust.
	trusted bool
}

func (f *sandboxFlags) register(fs *pflag.FlagSet) {
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

// dirs are the areas root and the state directory, resolved and checked
// (trust).
func (f *sandboxFlags) dirs() (root, state string, err error) {
	if err := f.trust(); err != nil {
		return "", "", err
	}
	return f.areasRoot, f.stateDir, nil
}

// runner builds the bwrap driver and a runner over src; the driver's
// warnings (the sandbox disabled) go to warnings.
func (f *sandboxFlags) runner(src sandboxtoml.Source, warnings io.Writer) (*sandboxtoml.Runner, error) {
	root, state, err := f.dirs()
	if err != nil {
		return nil, err
	}
	rt, err := bwrap.New(bwrap.Config{StateDir: state, Warnings: warnings, AllowUnlimited: f.allowUnlimited, JoinCgroupToStart: f.oneShot})
	if err != nil {
		return nil, err
	}
	home, _ := os.UserHomeDir()
	host := instance.Host{AreasRoot: root, Home: home}
	var networks *egress.Networks
	if os.Geteuid() == 0 {
		if networks, err = localNetworks(state); err != nil {
			return nil, err
		}
		host.NetnsDir = networks.Dir
	}
	r := sandboxtoml.NewRunner(src, rt, v1alpha1.BackendBwrap, host)
	r.Networks = networks
	r.Guard = []string{f.config, state}
	return r, nil
}

// localNetworks keeps the namespaces and proxies of egress allowlists in
// state, while this process runs. The proxies refuse this host's own
// addresses, as the controller's do.
func localNetworks(state string) (*egress.Networks, error) {
	n := &egress.Networks{Dir: filepath.Join(state, "netns")}
	if err := n.RefuseHostAddresses(); err != nil {
		return nil, err
	}
	return n, nil
}

// staticRunner is the runner of the agent's sandbox as the configuration
// file says now.
func (f *sandboxFlags) staticRunner(warnings io.Writer) (*sandboxtoml.Runner, error) {
	if err := f.trust(); err != nil {
		return nil, err
	}
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

func newRunCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cmd := c.verb(&cobra.Command{
		Use:   "run --config FILE --agent NAME [--areas-root DIR] -- COMMAND [ARG...]",
		Short: "Run one command in the agent's sandbox",
		Long: `run runs one command in the agent's sandbox and exits with its exit code;
its stdin, stdout and stderr are the command's. A refused command runs
nothing, prints the reason and exits 126; a sandboxctl failure exits 125.`,
		Example: `  sandboxctl run --config sandbox.toml --agent ada -- git status
  sandboxctl run --agent ada --config sandbox.toml -- sh -c 'make test'`,
	}, func(cmd *cobra.Command, args []string) int {
		return runCommand(cmd, &f, args, c.stdin, c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	return cmd
}

func runCommand(cmd *cobra.Command, f *sandboxFlags, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if f.agent == "" || len(argv) == 0 {
		return usageError(cmd, "--agent and a command after -- are required")
	}
	f.oneShot = true
	r, err := f.staticRunner(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		if err := r.Leave(context.Background()); err != nil {
			fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		}
	}()
	st, err := r.Exec(ctx, runtimes.ExecRequest{Argv: argv, Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		fmt.Fprint(stderr, repairHint(err, f))
		if runtimes.ReasonOf(err) == runtimes.ReasonRefused {
			return exitRefused
		}
		return exitFailed
	}
	return st.Code
}

// maxServeOutput bounds what serve keeps of one command's stdout and
// stderr together.
const maxServeOutput = 16 << 20

// serveOutput keeps the first max bytes of a command's stdout and stderr
// together; past them it keeps nothing more and ends the command (over).
// What a command prints is the agent's to choose: `yes` prints for ever.
type serveOutput struct {
	max  int
	over func()
	mu   sync.Mutex
	bufs [2]bytes.Buffer
	cut  bool
}

func (o *serveOutput) stream(i int) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		room := o.max - o.bufs[0].Len() - o.bufs[1].Len()
		if len(p) > room {
			o.bufs[i].Write(p[:max(room, 0)])
			if !o.cut {
				o.cut = true
				o.over()
			}
			return len(p), nil
		}
		o.bufs[i].Write(p)
		return len(p), nil
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

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

func newServeCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cmd := c.verb(&cobra.Command{
		Use:   "serve --config FILE --agent NAME [--areas-root DIR]",
		Short: "Run commands read one a line from stdin, answering in JSON",
		Long: `serve reads one command a line from stdin as a JSON array of strings
(["git","status"]) and answers each with one JSON line
{"exit":0,"stdout":"...","stderr":"...","error":"..."}. It watches the
configuration file: a valid change applies to the next command; an invalid
one is reported on stderr and the last good configuration stays in force.
A command's stdout and stderr are kept up to 16 MiB together: one that
prints more is ended, and its answer has an error saying so.`,
		Example: `  echo '["git","status"]' | sandboxctl serve --config sandbox.toml --agent ada`,
	}, func(cmd *cobra.Command, args []string) int {
		if f.agent == "" || len(args) != 0 {
			return usageError(cmd, "--agent is required and takes no arguments")
		}
		return serve(&f, c.stdin, c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	return cmd
}

func serve(f *sandboxFlags, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "sandboxctl: "+format+"\n", a...) }
	if err := f.trust(); err != nil {
		logf("%v", err)
		return exitFailed
	}
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
			cctx, cancel := context.WithCancel(ctx)
			out := &serveOutput{max: maxServeOutput, over: cancel}
			st, err := r.Exec(cctx, runtimes.ExecRequest{Argv: argv, Stdin: bytes.NewReader(nil), Stdout: out.stream(0), Stderr: out.stream(1)})
			cancel()
			resp = response{Exit: st.Code, Stdout: out.bufs[0].String(), Stderr: out.bufs[1].String()}
			if out.cut && ctx.Err() == nil {
				resp.Exit = exitFailed
				resp.Error = fmt.Sprintf("the command printed more than the %d bytes of output serve keeps; it was ended", maxServeOutput)
			} else if err != nil {
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

func newConvertCommand(c *cli) *cobra.Command {
	var agent, name, namespace string
	cmd := c.verb(&cobra.Command{
		Use:     "convert FILE --agent NAME [--name NAME] [--namespace NS]",
		Short:   "Print the Sandbox manifest of a sandbox.toml, for kubectl apply",
		Example: `  sandboxctl convert sandbox.toml --agent ada --namespace team-a | kubectl apply -f -`,
	}, func(cmd *cobra.Command, args []string) int {
		if len(args) != 1 || agent == "" {
			return usageError(cmd, "a FILE and --agent are required")
		}
		return convert(args[0], agent, name, namespace, c.stdout, c.stderr)
	})
	cmd.Flags().StringVar(&agent, "agent", "", "the agent's name (a DNS-1123 label); required")
	cmd.Flags().StringVar(&name, "name", "", "the Sandbox's name (default the agent's name)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "the Sandbox's namespace (default: left to kubectl)")
	return cmd
}

func convert(file, agent, name, namespace string, stdout, stderr io.Writer) int {
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
