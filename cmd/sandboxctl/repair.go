package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/cireilclaw/sandbox-controller/runtimes/mounttree"
)

// repairHint is said after an error caused by a link the agent left on the
// way to a mount's destination: the way out, for a sandbox that can run no
// command to repair itself.
func repairHint(err error, f *sandboxFlags) string {
	if !errors.Is(err, mounttree.ErrLinkInPath) {
		return ""
	}
	return fmt.Sprintf("sandboxctl: the agent left a symbolic link or a file on the way to a custom mount's destination in its workspace, so no sandbox can be built; "+
		"sandboxctl repair --config %s --agent %s --areas-root %s moves it aside (nothing is deleted)\n", f.config, f.agent, f.areasRoot)
}

func newRepairCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cmd := c.verb(&cobra.Command{
		Use:   "repair --config FILE --agent NAME [--areas-root DIR]",
		Short: "Move aside what blocks the way to a custom mount's destination",
		Long: `repair moves aside (renames to NAME.blocked-TIME, deleting nothing) each
symbolic link or file the agent left on the way to a custom mount's
destination in its workspace: with one there no sandbox can be built, so run
refuses every command until it is gone.`,
		Example: `  sandboxctl repair --config sandbox.toml --agent ada`,
	}, func(cmd *cobra.Command, args []string) int {
		if f.agent == "" || len(args) != 0 {
			return usageError(cmd, "--agent is required and takes no arguments")
		}
		return repair(&f, c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	return cmd
}

// repair moves aside what blocks the way to the custom mounts'
// destinations in the agent's workspace.
func repair(f *sandboxFlags, stdout, stderr io.Writer) int {
	in, err := f.instance()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	ws, ok := in.Workspace()
	if !ok {
		fmt.Fprintf(stderr, "sandboxctl: instance %s has no workspace\n", in.Name)
		return exitFailed
	}
	moved, err := mounttree.For(in).Repair(in.SourceDir(ws), time.Now().Unix())
	for _, m := range moved {
		fmt.Fprintf(stdout, "moved %s aside to %s (it blocked a mount's destination)\n", m.Path, m.MovedTo)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	if len(moved) == 0 {
		fmt.Fprintln(stdout, "nothing blocks the mounts' destinations")
	}
	return 0
}
