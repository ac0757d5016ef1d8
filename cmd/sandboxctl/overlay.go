package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
)

var changeLetter = map[overlay.Kind]string{overlay.Added: "A", overlay.Changed: "M", overlay.Deleted: "D"}

// overlayMount finds the overlay mount at target (relative to /workspace).
func (f *sandboxFlags) overlayMount(target string) (*overlay.Layers, error) {
	in, err := f.instance()
	if err != nil {
		return nil, err
	}
	for _, m := range in.Mounts {
		if m.Target == "/workspace/"+target {
			if m.Overlay == nil {
				return nil, fmt.Errorf("mount %s is not an overlay mount (mode %q)", target, map[bool]string{true: "ro", false: "rw"}[m.ReadOnly])
			}
			return m.Overlay, nil
		}
	}
	return nil, fmt.Errorf("no mount with target %q in %s", target, f.config)
}

func newDiffCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	cmd := c.verb(&cobra.Command{
		Use:   "diff --config FILE --agent NAME [--areas-root DIR] TARGET",
		Short: "List what the sandbox changed in an overlay mount, with a digest",
		Long: `diff lists what the sandbox changed in an overlay mount (mode = "overlay"):
A added, M changed, D deleted, with each file's mode and SHA-256, relative to
the mount, and a digest of the whole set, for sandboxctl apply.`,
		Example: `  sandboxctl diff --config sandbox.toml --agent ada project`,
	}, func(cmd *cobra.Command, args []string) int {
		if f.agent == "" || len(args) != 1 {
			return usageError(cmd, "--agent and one overlay mount target are required")
		}
		return overlayCommand("diff", &f, args[0], "", c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	return cmd
}

func newApplyCommand(c *cli) *cobra.Command {
	var f sandboxFlags
	var digest string
	cmd := c.verb(&cobra.Command{
		Use:   "apply --config FILE --agent NAME [--areas-root DIR] --digest DIGEST TARGET",
		Short: "Write an overlay mount's reviewed changes to its host source",
		Long: `apply writes the changes diff listed to the mount's host source, only if they
still have the digest given with --digest; otherwise it changes nothing.`,
		Example: `  sandboxctl diff  --config sandbox.toml --agent ada project
  sandboxctl apply --config sandbox.toml --agent ada --digest sha256:... project`,
	}, func(cmd *cobra.Command, args []string) int {
		if f.agent == "" || len(args) != 1 {
			return usageError(cmd, "--agent and one overlay mount target are required")
		}
		if digest == "" {
			return usageError(cmd, "--digest is required: run sandboxctl diff, review the changes and pass the digest it printed")
		}
		return overlayCommand("apply", &f, args[0], digest, c.stdout, c.stderr)
	})
	f.register(cmd.Flags())
	cmd.Flags().StringVar(&digest, "digest", "", "the digest diff printed for the changes you reviewed; apply refuses, changing nothing, if the changes now differ")
	return cmd
}

// overlayCommand is diff (list the sandbox's changes to an overlay mount
// and their digest) or apply (write them to the host source, only when they
// still have the reviewed digest).
func overlayCommand(name string, f *sandboxFlags, target, digest string, stdout, stderr io.Writer) int {
	l, err := f.overlayMount(target)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	var changes []overlay.Change
	if name == "diff" {
		changes, err = l.Diff()
	} else {
		var lower *areas.Root
		if lower, err = areas.OpenRootAt("/workspace/"+target, l.LowerDir(), false); err == nil {
			changes, err = l.Apply(lower, digest)
		}
	}
	for _, c := range changes {
		fmt.Fprintln(stdout, changeLine(c))
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	if name == "diff" {
		fmt.Fprintf(stdout, "digest %s\n", overlay.Digest(changes))
	}
	return 0
}

// changeLine is one change for a reviewer: letter, type, mode, content
// hash, path. A path holding control characters, quotes or a backslash is
// printed quoted, so that a name cannot pass for another line.
func changeLine(c overlay.Change) string {
	mode, sum := "-", "-"
	if c.Type == areas.TypeFile {
		mode, sum = fmt.Sprintf("%04o", uint32(c.Mode.Perm())), "sha256:"+c.SHA256
	}
	p := c.Path
	if q := strconv.Quote(p); q != `"`+p+`"` || strings.ContainsRune(p, ' ') {
		p = q
	}
	return fmt.Sprintf("%s %-8s %s %s %s", changeLetter[c.Kind], c.Type, mode, sum, p)
}
