package main

import (
	"fmt"
	"io"

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

// overlayCommand is diff (list the sandbox's changes to an overlay mount)
// or apply (write them to the host source).
func overlayCommand(name string, args []string, stdout, stderr io.Writer) int {
	var f sandboxFlags
	fs := newFlagSet(name, name+" --config FILE --agent NAME [--areas-root DIR] TARGET", stderr)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if f.agent == "" || fs.NArg() != 1 {
		fmt.Fprintf(stderr, "sandboxctl %s: --agent and one overlay mount target are required\n", name)
		fs.Usage()
		return exitUsage
	}
	l, err := f.overlayMount(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	var changes []overlay.Change
	if name == "diff" {
		changes, err = l.Diff()
	} else {
		var lower *areas.Root
		if lower, err = areas.OpenRoot("/workspace/"+fs.Arg(0), l.Lower, false); err == nil {
			changes, err = l.Apply(lower)
		}
	}
	for _, c := range changes {
		fmt.Fprintf(stdout, "%s %s\n", changeLetter[c.Kind], c.Path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	return 0
}
