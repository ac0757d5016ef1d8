package main

import (
	"errors"
	"fmt"
	"io"
	"time"

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

// repair moves aside what blocks the way to the custom mounts'
// destinations in the agent's workspace.
func repair(args []string, stdout, stderr io.Writer) int {
	var f sandboxFlags
	fs := newFlagSet("repair", "repair --config FILE --agent NAME [--areas-root DIR]", stderr)
	f.register(fs)
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if f.agent == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "sandboxctl repair: --agent is required and takes no arguments")
		fs.Usage()
		return exitUsage
	}
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
