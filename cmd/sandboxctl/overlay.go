package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

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

// overlayCommand is diff (list the sandbox's changes to an overlay mount
// and their digest) or apply (write them to the host source, only when they
// still have the reviewed digest).
func overlayCommand(name string, args []string, stdout, stderr io.Writer) int {
	var f sandboxFlags
	var digest string
	synopsis := name + " --config FILE --agent NAME [--areas-root DIR] TARGET"
	if name == "apply" {
		synopsis = "apply --config FILE --agent NAME [--areas-root DIR] --digest DIGEST TARGET"
	}
	fs := newFlagSet(name, synopsis, stderr)
	f.register(fs)
	if name == "apply" {
		fs.StringVar(&digest, "digest", "", "the digest diff printed for the changes you reviewed; apply refuses, changing nothing, if the changes now differ")
	}
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if f.agent == "" || fs.NArg() != 1 {
		fmt.Fprintf(stderr, "sandboxctl %s: --agent and one overlay mount target are required\n", name)
		fs.Usage()
		return exitUsage
	}
	if name == "apply" && digest == "" {
		fmt.Fprintln(stderr, "sandboxctl apply: --digest is required: run sandboxctl diff, review the changes and pass the digest it printed")
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
		if lower, err = areas.OpenRootAt("/workspace/"+fs.Arg(0), l.LowerDir(), false); err == nil {
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
