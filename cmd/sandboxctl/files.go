package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/cireilclaw/sandbox-controller/frontends/sandboxtoml"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// maxCopy bounds one copy into the sandbox: the write is atomic, so the
// whole file is held once in memory.
const maxCopy = 1 << 30

// instance describes the agent's sandbox from the configuration file.
func (f *sandboxFlags) instance() (runtimes.Instance, error) {
	spec, err := sandboxtoml.Load(f.config, f.agent)
	if err != nil {
		return runtimes.Instance{}, err
	}
	root, err := filepath.Abs(f.areasRoot)
	if err != nil || f.areasRoot == "" {
		return runtimes.Instance{}, fmt.Errorf("areas root %q: give an absolute directory with --areas-root", f.areasRoot)
	}
	home, _ := os.UserHomeDir()
	return instance.Standalone(spec, instance.Host{AreasRoot: root, Home: home})
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

func listFiles(args []string, stdout, stderr io.Writer) int {
	var f sandboxFlags
	fs := newFlagSet("ls", "ls --config FILE --agent NAME [--areas-root DIR] [SANDBOX_PATH]", stderr)
	f.register(fs)
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if f.agent == "" || fs.NArg() > 1 {
		fmt.Fprintln(stderr, "sandboxctl ls: --agent and at most one sandbox path (default /workspace) are required")
		fs.Usage()
		return exitUsage
	}
	p := "/workspace"
	if fs.NArg() == 1 {
		p = fs.Arg(0)
	}
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Mode, e.Size, e.ModTime.Format("2006-01-02 15:04"), e.Name)
	}
	if err := tw.Flush(); err != nil {
		return exitFailed
	}
	return 0
}

// copyFiles copies one file between the host and the sandbox. A sandbox
// path is written with a leading ':' (:/workspace/notes.txt); exactly one
// side must be one.
func copyFiles(args []string, stdout, stderr io.Writer) int {
	var f sandboxFlags
	var c clusterFlags
	fs := newFlagSet("cp", "cp [--config FILE --agent NAME [--areas-root DIR]] [-n NS] SRC DST\n  local sandbox: one side is :/sandbox/path (with --config and --agent)\n  a SessionClaim's sandbox: one side is CLAIM:/sandbox/path (through the exec API)", stderr)
	f.register(fs)
	c.register(fs)
	if err := parseAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 2 {
		fmt.Fprintln(stderr, "sandboxctl cp: a source and a destination are required")
		fs.Usage()
		return exitUsage
	}
	src, dst := fs.Arg(0), fs.Arg(1)
	inSrc, inDst := strings.HasPrefix(src, ":"), strings.HasPrefix(dst, ":")
	if !inSrc && !inDst {
		return remoteCopy(c, src, dst, stderr)
	}
	if inSrc == inDst || f.agent == "" {
		fmt.Fprintln(stderr, "sandboxctl cp: exactly one of source and destination must be a sandbox path (:/path with --agent, or CLAIM:/path)")
		return exitUsage
	}
	v, err := f.view()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	if inSrc {
		err = copyOut(v, src[1:], dst)
	} else {
		err = copyIn(v, src, dst[1:])
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	return 0
}

func copyOut(v *areas.View, sandboxPath, hostPath string) error {
	root, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return err
	}
	in, err := root.Open(rel)
	if err != nil {
		return fmt.Errorf("copying %s out of the sandbox: %w", sandboxPath, err)
	}
	defer in.Close()
	if fi, err := os.Stat(hostPath); err == nil && fi.IsDir() {
		hostPath = filepath.Join(hostPath, filepath.Base(sandboxPath))
	}
	out, err := os.Create(hostPath)
	if err != nil {
		return fmt.Errorf("copying %s to %s: %w", sandboxPath, hostPath, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", sandboxPath, hostPath, err)
	}
	return out.Close()
}

func copyIn(v *areas.View, hostPath, sandboxPath string) error {
	in, err := os.Open(hostPath)
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
