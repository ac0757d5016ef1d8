package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/frontends/sandboxtoml"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// maxCopy bounds one copy: into the sandbox, where the write is atomic
// and the whole file is held once in memory, and out of it, where the
// sandbox decides how large the file is.
const maxCopy = 1 << 30

// instance describes the agent's sandbox from the configuration file.
func (f *sandboxFlags) instance() (runtimes.Instance, error) {
	if err := f.trust(); err != nil {
		return runtimes.Instance{}, err
	}
	spec, err := sandboxtoml.Load(f.config, f.agent)
	if err != nil {
		return runtimes.Instance{}, err
	}
	home, _ := os.UserHomeDir()
	return instance.Standalone(spec, instance.Host{AreasRoot: f.areasRoot, Home: home})
}

// view opens the agent's file view (areas and mounts) through internal/areas,
// laying the areas out first when they are missing.
func (f *sandboxFlags) view() (*areas.View, error) {
	in, err := f.instance()
	if err != nil {
		return nil, err
	}
	return in.FileView()
}

func newListCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cmd := c.verb(&cobra.Command{
		Use:     "ls --config FILE --agent NAME [--areas-root DIR] [SANDBOX_PATH]",
		Short:   "List a directory of the agent's sandbox (default /workspace)",
		Example: `  sandboxctl ls --config sandbox.toml --agent ada /workspace/src`,
	}, func(cmd *cobra.Command, args []string) int {
		if f.agent == "" || len(args) > 1 {
			return usageError(cmd, "--agent and at most one sandbox path (default /workspace) are required")
		}
		p := "/workspace"
		if len(args) == 1 {
			p = args[0]
		}
		return listFiles(&f, p, c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	return cmd
}

func listFiles(f *sandboxFlags, p string, stdout, stderr io.Writer) int {
	v, err := f.view()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	root, rel, err := v.Resolve(p)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	entries, err := root.List(rel)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: listing %s: %v\n", p, err)
		return exitFailed
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Mode, e.Size, e.ModTime.Format("2006-01-02 15:04"), displayName(e.Name))
	}
	if err := tw.Flush(); err != nil {
		return exitFailed
	}
	return 0
}

func newCopyCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cf := newClusterFlags()
	cmd := c.verb(&cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy one file into or out of a sandbox",
		Long: `cp copies one file in or out. The sandbox side is written with a leading
':' for the agent's sandbox on this host (with --config and --agent), or as
CLAIM:/path for a SessionClaim's sandbox, through the exec API. Every access
inside the sandbox is contained: a symbolic link that leaves its area or
mount is refused.`,
		Example: `  # a SessionClaim's sandbox
  kubectl sandbox cp notes.txt alice-session-1:/workspace/ -n team-a
  kubectl sandbox cp alice-session-1:/workspace/report.md . -n team-a

  # the agent's sandbox on this host
  sandboxctl cp --config sandbox.toml --agent ada notes.txt :/workspace/`,
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) >= 2 || strings.HasPrefix(toComplete, ".") || strings.HasPrefix(toComplete, "/") || strings.Contains(toComplete, ":") {
				return nil, cobra.ShellCompDirectiveDefault
			}
			names, d := claimNames(cf, toComplete, ":")
			if d == cobra.ShellCompDirectiveError {
				return nil, cobra.ShellCompDirectiveDefault
			}
			// A local file name may be meant as well.
			return names, cobra.ShellCompDirectiveNoSpace
		},
	}, func(cmd *cobra.Command, args []string) int {
		if len(args) != 2 {
			return usageError(cmd, "a source and a destination are required")
		}
		return copyFiles(cmd, &f, cf, args[0], args[1], c.stderr)
	})
	f.register(cmd.Flags())
	cf.register(cmd.Flags())
	registerClusterCompletion(cmd, cf)
	return cmd
}

// copyFiles copies one file between the host and the sandbox. A sandbox
// path is written with a leading ':' (:/workspace/notes.txt); exactly one
// side must be one.
func copyFiles(cmd *cobra.Command, f *sandboxFlags, c *clusterFlags, src, dst string, stderr io.Writer) int {
	inSrc, inDst := strings.HasPrefix(src, ":"), strings.HasPrefix(dst, ":")
	if !inSrc && !inDst {
		return remoteCopy(cmd, c, src, dst, stderr)
	}
	if inSrc == inDst || f.agent == "" {
		return usageError(cmd, "exactly one of source and destination must be a sandbox path (:/path with --agent, or CLAIM:/path)")
	}
	in, err := f.instance()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	v, err := in.FileView()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	if inSrc {
		err = copyOut(v, src[1:], dst, sandboxWritable(in))
	} else {
		err = copyIn(v, src, dst[1:], sandboxWritable(in))
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	return 0
}

// copyOut copies a file of the sandbox to hostPath. The way to hostPath
// may pass through directories the sandbox can write (a read-write
// mount's source), where the agent's links are never followed.
func copyOut(v *areas.View, sandboxPath, hostPath string, writable []os.FileInfo) error {
	root, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return err
	}
	in, err := root.Open(rel)
	if err != nil {
		return fmt.Errorf("copying %s out of the sandbox: %w", sandboxPath, err)
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return fmt.Errorf("copying %s out of the sandbox: %w", sandboxPath, err)
	} else if err := tooLarge(fi.Size()); err != nil {
		return fmt.Errorf("copying %s out of the sandbox: %w", sandboxPath, err)
	}
	d, base, err := localDestination(hostPath, filepath.Base(sandboxPath), writable)
	if err != nil {
		return fmt.Errorf("copying %s to %s: %w", sandboxPath, hostPath, err)
	}
	defer d.Close()
	if err := writeLocalAt(d, base, in); err != nil {
		return fmt.Errorf("copying %s to %s: %w", sandboxPath, filepath.Join(d.Name(), base), err)
	}
	return nil
}

// copyIn copies the host file hostPath into the sandbox. The file may be
// in a directory the sandbox can write (a read-write mount's source),
// where the agent's links are never followed.
func copyIn(v *areas.View, hostPath, sandboxPath string, writable []os.FileInfo) error {
	in, err := openHostFile(hostPath, writable)
	if err != nil {
		return fmt.Errorf("copying %s into the sandbox: %w", hostPath, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copying %s into the sandbox: only regular files are copied", hostPath)
	}
	if fi.Size() > maxCopy {
		return fmt.Errorf("copying %s into the sandbox: %d bytes is more than the %d-byte limit of one copy", hostPath, fi.Size(), maxCopy)
	}
	data, err := io.ReadAll(io.LimitReader(in, maxCopy+1))
	if err != nil {
		return err
	}
	root, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return err
	}
	if e, err := root.Stat(rel); err == nil && e.IsDir() {
		rel = filepath.Join(rel, filepath.Base(hostPath))
	}
	if err := root.Write(rel, data, fi.Mode().Perm()); err != nil {
		return fmt.Errorf("copying %s to %s: %w", hostPath, sandboxPath, err)
	}
	return nil
}
