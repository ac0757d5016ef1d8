package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// completionPlugin is the name kubectl runs to complete `kubectl sandbox`
// (kubectl_complete-<plugin>); make install-plugin links it to sandboxctl.
const completionPlugin = "kubectl_complete-sandbox"

// cli holds one invocation's streams and the exit code its verb chose.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	code           int
}

// verb makes cmd run body, whose result is the exit code.
func (c *cli) verb(cmd *cobra.Command, body func(cmd *cobra.Command, args []string) int) *cobra.Command {
	cmd.Run = func(cmd *cobra.Command, args []string) { c.code = body(cmd, args) }
	return cmd
}

// usageError says what is wrong with the arguments, then the verb's usage,
// and is the usage exit code.
func usageError(cmd *cobra.Command, format string, a ...any) int {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: "+format+"\n", append([]any{cmd.CommandPath()}, a...)...)
	fmt.Fprintf(cmd.ErrOrStderr(), "Run '%s --help' for usage and examples.\n", cmd.CommandPath())
	return exitUsage
}

// newRoot builds the command tree. As the kubectl plugin (kubectl-sandbox)
// its commands are shown as kubectl sandbox.
func newRoot(c *cli, name string) *cobra.Command {
	root := &cobra.Command{
		Use:           "sandboxctl",
		Short:         "Run commands in an agent's least-privilege sandbox",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Verbs parse their own positional arguments and say what is
		// missing in their words.
		Args: cobra.ArbitraryArgs,
		Run: func(cmd *cobra.Command, args []string) {
			if len(args) > 0 {
				c.code = usageError(cmd, "unknown command %q", args[0])
				return
			}
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Help()
			c.code = exitUsage
		},
	}
	if strings.HasPrefix(name, "kubectl") {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl sandbox"}
	}
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		c.code = usageError(cmd, "%v", err)
		return errHandled
	})
	root.AddGroup(&cobra.Group{ID: "local", Title: "On this host, from a sandbox.toml:"},
		&cobra.Group{ID: "claim", Title: "In a SessionClaim's sandbox, through the exec API:"})
	for _, cmd := range []*cobra.Command{
		newRunCommand(c), newServeCommand(c), newConvertCommand(c), newListCommand(c),
		newDiffCommand(c), newApplyCommand(c), newRepairCommand(c), newGCCommand(c),
	} {
		cmd.GroupID = "local"
		root.AddCommand(cmd)
	}
	for _, cmd := range []*cobra.Command{newExecCommand(c), newCopyCommand(c), newMCPCommand(c)} {
		cmd.GroupID = "claim"
		root.AddCommand(cmd)
	}
	root.SetHelpCommandGroupID("")
	root.SetCompletionCommandGroupID("")
	return root
}

// errHandled is returned where the exit code is already chosen and the
// error already said.
var errHandled = errors.New("handled")

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runAs("sandboxctl", args, stdin, stdout, stderr)
}

// runAs runs the command line args of the program called name.
func runAs(name string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if filepath.Base(name) == completionPlugin {
		args = append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	root := newRoot(c, filepath.Base(name))
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		if !errors.Is(err, errHandled) {
			cmd, _, ferr := root.Find(args)
			if ferr != nil || cmd == nil {
				cmd = root
			}
			return usageError(cmd, "%v", err)
		}
	}
	return c.code
}

const rootLong = `sandboxctl runs commands in an agent's least-privilege sandbox: on this
host from a sandbox.toml, without a cluster, or in a SessionClaim's sandbox
through the controller's exec API (installed as the kubectl plugin:
kubectl sandbox exec CLAIM -- git status).

  sandboxctl run     --config FILE --agent NAME -- COMMAND [ARG...]
  sandboxctl serve   --config FILE --agent NAME
  sandboxctl convert FILE --agent NAME
  sandboxctl ls      --config FILE --agent NAME [SANDBOX_PATH]
  sandboxctl cp      --config FILE --agent NAME SRC DST      (one side :/path)
  sandboxctl diff    --config FILE --agent NAME TARGET
  sandboxctl apply   --config FILE --agent NAME --digest D TARGET
  sandboxctl repair  --config FILE --agent NAME
  sandboxctl mcp     --config FILE --agent NAME
  sandboxctl exec    [-n NS] [-i] CLAIM -- COMMAND [ARG...]
  sandboxctl cp      [-n NS] SRC DST                           (one side CLAIM:/path)
  sandboxctl mcp     [-n NS] CLAIM

Flags go anywhere on the line, before or after the arguments; what follows
"--" is the command's. The configuration file is optional: a missing file
means the bwrap backend with no mounts and no allowed binaries. Agent areas
live in <areas-root>/<agent>/{workspace,memories,blocks,skills,tasks} and
are created when missing.

Exit codes: a command's own; 2 for a usage error; 125 when sandboxctl could
not run the command; 126 when the policy refused it and nothing ran.

Shell completion: sandboxctl completion bash|zsh|fish|powershell; kubectl
completes kubectl sandbox through kubectl_complete-sandbox (make
install-plugin links it).`

// claimNames completes the names of the SessionClaims in the namespace the
// flags choose; suffix is added to each (":" for cp).
func claimNames(cf *clusterFlags, toComplete, suffix string) ([]string, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	loader := cf.kube.loader()
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	ns, err := cf.kube.namespace(loader)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	list, err := dc.Resource(v1alpha1.GroupVersion.WithResource("sessionclaims")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []string
	for _, o := range list.Items {
		if strings.HasPrefix(o.GetName(), toComplete) {
			out = append(out, o.GetName()+suffix)
		}
	}
	sort.Strings(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}

// namespaceNames completes --namespace.
func namespaceNames(cf *clusterFlags, toComplete string) ([]string, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg, err := cf.kube.loader().ClientConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	list, err := dc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []string
	for _, n := range list.Items {
		if strings.HasPrefix(n.GetName(), toComplete) {
			out = append(out, n.GetName())
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// registerClusterCompletion completes the flags of cf on cmd.
func registerClusterCompletion(cmd *cobra.Command, cf *clusterFlags) {
	_ = cmd.RegisterFlagCompletionFunc("namespace", func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return namespaceNames(cf, toComplete)
	})
	_ = cmd.RegisterFlagCompletionFunc("via", cobra.FixedCompletions([]string{viaAPIServer, viaNode}, cobra.ShellCompDirectiveNoFileComp))
}

// dashArgs splits a verb's arguments at "--": before it, and the command
// after it (nil when there is no "--").
func dashArgs(cmd *cobra.Command, args []string) (before, after []string, dash bool) {
	if i := cmd.ArgsLenAtDash(); i >= 0 {
		return args[:i], args[i:], true
	}
	return args, nil, false
}

func main() {
	os.Exit(runAs(os.Args[0], os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
