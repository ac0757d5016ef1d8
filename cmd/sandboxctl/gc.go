package main

import (
	"fmt"
	"sort"

	"github.com/spf13/cobra"

	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

func newGCCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	var dryRun bool
	cmd := c.verb(&cobra.Command{
		Use:   "gc [--areas-root DIR] [--state-dir DIR] [--dry-run]",
		Short: "List and remove mount trees nothing will come back for",
		Long: `gc finds the mount trees of this host that no sandbox will use again and
removes them: those of a state directory that no longer exists (a deleted
clone, a throw-away areas root, a reinstalled node) and, below this state
directory, those of instances it no longer records. Every start of
sandboxctl or the controller does the same; gc says what it found. Stale
mounts slow every mount on the host down, bubblewrap's starts included.
Agent areas are never touched.`,
		Example: `  sandboxctl gc --dry-run
  sudo sandboxctl gc --areas-root /var/lib/sandbox-controller/areas --state-dir /var/lib/sandbox-controller/areas/.runtime`,
		Args: cobra.NoArgs,
	}, func(cmd *cobra.Command, _ []string) int {
		_, state, err := f.dirs()
		if err != nil {
			return usageError(cmd, "%v", err)
		}
		st, err := bwrap.FindStaleTrees(state)
		if err != nil {
			fmt.Fprintf(c.stderr, "sandboxctl gc: %v\n", err)
			return exitFailed
		}
		var lines []string
		for dir, owner := range st.Abandoned {
			lines = append(lines, fmt.Sprintf("%s\tits state directory %s is gone", dir, owner))
		}
		for _, g := range st.Unrecorded {
			lines = append(lines, fmt.Sprintf("%s\tno instance of %s records it", g, state))
		}
		for _, m := range st.Images {
			lines = append(lines, fmt.Sprintf("%s\tan image mount no instance of %s records", m, state))
		}
		sort.Strings(lines)
		code, verb := 0, "stale"
		if !dryRun {
			verb = "removed"
			if err := st.Remove(); err != nil {
				fmt.Fprintf(c.stderr, "sandboxctl gc: %v\n", err)
				code, verb = exitFailed, "stale"
			}
		}
		for _, l := range lines {
			fmt.Fprintf(c.stdout, "%s\t%s\n", verb, l)
		}
		if len(lines) == 0 {
			fmt.Fprintln(c.stdout, "no stale mount trees")
		}
		return code
	})
	cmd.Flags().StringVar(&f.areasRoot, "areas-root", defaultAreasRoot(), "the directory holding one directory of areas per agent")
	cmd.Flags().StringVar(&f.stateDir, "state-dir", "", "the state directory whose unrecorded trees go too (default <areas-root>/.sandboxctl)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what is stale, remove nothing")
	return cmd
}
