package areas

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Binding is one host directory and where it appears in the sandbox: a
// standard area (/workspace, /memories, /blocks, ...) or a custom mount
// (/workspace/<target>).
type Binding struct {
	// Target is the absolute mount point inside the sandbox.
	Target string
	// Dir is the host directory, resolved beneath its anchor on every
	// access.
	Dir      HostDir
	ReadOnly bool
}

// View is the sandbox's file system as one agent sees it: a set of roots,
// each at a mount point. A path belongs to the root with the longest mount
// point that is a prefix of it at a "/" boundary, so /workspace/project/x
// goes to a mount at /workspace/project rather than to /workspace.
type View struct {
	// mounts are kept longest mount point first, so the first match wins.
	mounts []viewMount
}

type viewMount struct {
	point string
	root  *Root
}

// OpenView opens one Root per binding, named by its target, acting as id
// (Root.As), and returns the view of them all.
func OpenView(bindings []Binding, id Identity) (*View, error) {
	v := &View{}
	for _, b := range bindings {
		r, err := OpenRootAt(b.Target, b.Dir, b.ReadOnly)
		if err != nil {
			return nil, err
		}
		r = r.As(id)
		if err := v.Add(b.Target, r); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// Add places r at mountPoint, which must be absolute, clean, not "/" and
// not already taken.
func (v *View) Add(mountPoint string, r *Root) error {
	if !strings.HasPrefix(mountPoint, "/") || path.Clean(mountPoint) != mountPoint || mountPoint == "/" {
		return fmt.Errorf("adding root %q to a view: mount point %q must be an absolute, clean path below /", r.Name(), mountPoint)
	}
	for _, m := range v.mounts {
		if m.point == mountPoint {
			return fmt.Errorf("adding root %q to a view: mount point %s is already taken by root %q", r.Name(), mountPoint, m.root.Name())
		}
	}
	v.mounts = append(v.mounts, viewMount{point: mountPoint, root: r})
	slices.SortStableFunc(v.mounts, func(a, b viewMount) int { return len(b.point) - len(a.point) })
	return nil
}

// ErrNoRoot is wrapped when a sandbox path lies under no mount point of a
// view.
var ErrNoRoot = errors.New("the path is not inside any area or mount")

// Resolve picks the root a sandbox path belongs to and returns the path
// relative to it ("." for the root itself). The sandbox path is cleaned
// lexically first, so ".." in it is taken textually and can only move
// between mount points, never below "/"; symbolic links are left for the
// Root to resolve, contained, when the file is accessed.
func (v *View) Resolve(sandboxPath string) (*Root, string, error) {
	if !strings.HasPrefix(sandboxPath, "/") {
		return nil, "", fmt.Errorf("resolving sandbox path %q: %w: sandbox paths are absolute", sandboxPath, ErrInvalidPath)
	}
	if strings.IndexByte(sandboxPath, 0) >= 0 {
		return nil, "", fmt.Errorf("resolving sandbox path %q: %w: the path contains a NUL byte", sandboxPath, ErrInvalidPath)
	}
	p := path.Clean(sandboxPath)
	for _, m := range v.mounts {
		if p == m.point {
			return m.root, ".", nil
		}
		if rest, ok := strings.CutPrefix(p, m.point+"/"); ok {
			return m.root, rest, nil
		}
	}
	return nil, "", fmt.Errorf("resolving sandbox path %q: %w", sandboxPath, ErrNoRoot)
}

// HostPath maps a sandbox path to the host path it corresponds to. It is
// the seed's ctx.paths.resolve, for trusted code: the mapping is purely
// lexical. It does not touch the file system and does not resolve symbolic
// links, so the result may lead through a link to anywhere; untrusted input
// must go through Resolve and the Root methods instead.
func (v *View) HostPath(sandboxPath string) (string, error) {
	r, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return "", err
	}
	return filepath.Join(r.HostPath(), filepath.FromSlash(rel)), nil
}
