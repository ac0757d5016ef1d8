package containerd

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/mounttree"
)

// runc binds each mount of the spec by its destination path inside the
// container's root, and a custom mount's destination (/workspace/<target>)
// lies in the workspace, which the agent writes: a link the agent leaves on
// that path moves the bind elsewhere (what runc's own CVE-2021-30465 fix
// guards for the root, not for a directory bound into it). So the spec
// binds no destination inside an area. The controller builds each
// instance's areas as a mount tree (runtimes/mounttree) in a directory only
// it writes, with the custom mounts attached beneath the workspace through
// descriptors opened without following links, and the container receives
// each area in one recursive bind of the tree, at /workspace and the other
// area targets of its fresh root, which the agent cannot write.
//
// The spec names an area by <trees>/<name>/current/<area>; current is a
// link, written only by the controller, to the newest generation. A start
// builds a new generation and points current at it; the generation before
// stays mounted (mounttree.Generations), so a task that resolved current a
// moment earlier still finds its tree. A running task holds its own copies
// of the mounts: the host trees can go once it has stopped.

// DefaultTreesDir holds the mount trees when Config.TreesDir is empty, one
// directory per daemon address and namespace. It lives below /run: trees
// are mounts and go with a reboot.
const DefaultTreesDir = "/run/sandbox-controller/containerd-trees"

func defaultTrees(address, namespace string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(address) + "\x00" + namespace))
	return filepath.Join(DefaultTreesDir, hex.EncodeToString(sum[:6]))
}

// treeLink is the name of the link to an instance's current generation.
const treeLink = "current"

// instanceTrees is the directory of one instance's trees.
func (r *Runtime) instanceTrees(name string) string { return filepath.Join(r.cfg.TreesDir, name) }

// AreaSource is the host path the spec binds area (a target such as
// /workspace) from: the area in the instance's current tree.
func (r *Runtime) AreaSource(name, target string) string {
	return filepath.Join(r.instanceTrees(name), treeLink, strings.TrimPrefix(target, "/"))
}

func (r *Runtime) generations(name string) mounttree.Generations {
	return mounttree.Generations{Dir: filepath.Join(r.instanceTrees(name), "gens")}
}

// buildTree builds a new generation of in's tree and points current at it,
// before a task starts. A link the agent left on a mount destination's path
// fails the build (mounttree.ErrLinkInPath), and the task does not start:
// its mounts would not be where the spec says.
func (r *Runtime) buildTree(in runtimes.Instance) error {
	r.treesMu.Lock()
	defer r.treesMu.Unlock()
	return r.inTreesNamespace(func() error { return r.buildTreeHere(in) })
}

func (r *Runtime) buildTreeHere(in runtimes.Instance) error {
	if !r.treesPrivate {
		// A tree in a mount that propagates would be unmounted, with its
		// copies in running containers, when a later build detaches it.
		// The parent is made private, once for every driver below it
		// (one per daemon address and namespace by default).
		if err := mounttree.MakePrivate(filepath.Dir(r.cfg.TreesDir)); err != nil {
			return fmt.Errorf("preparing the mount tree directory: %w", err)
		}
		if err := os.MkdirAll(r.cfg.TreesDir, 0o711); err != nil {
			return fmt.Errorf("preparing the mount tree directory: %w", err)
		}
		r.treesPrivate = true
	}
	dir, err := r.generations(in.Name).Build(mounttree.For(in))
	if err != nil {
		return fmt.Errorf("building the mount tree of the areas: %w", err)
	}
	base := r.instanceTrees(in.Name)
	rel, err := filepath.Rel(base, dir)
	if err != nil {
		return fmt.Errorf("pointing %s at the new mount tree: %w", base, err)
	}
	next := filepath.Join(base, treeLink+".next")
	if err := os.Remove(next); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pointing %s at the new mount tree: %w", base, err)
	}
	if err := os.Symlink(rel, next); err != nil {
		return fmt.Errorf("pointing %s at the new mount tree: %w", base, err)
	}
	if err := os.Rename(next, filepath.Join(base, treeLink)); err != nil {
		return fmt.Errorf("pointing %s at the new mount tree: %w", base, err)
	}
	return nil
}

// removeTrees detaches and removes every generation of the instance's
// tree, once no task of it runs.
func (r *Runtime) removeTrees(name string) error {
	r.treesMu.Lock()
	defer r.treesMu.Unlock()
	return r.inTreesNamespace(func() error { return r.removeTreesHere(name) })
}

func (r *Runtime) removeTreesHere(name string) error {
	if err := r.generations(name).Remove(); err != nil {
		return fmt.Errorf("removing the mount trees of %s: %w", name, err)
	}
	base := r.instanceTrees(name)
	for _, p := range []string{filepath.Join(base, treeLink), filepath.Join(base, treeLink+".next"), base} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the mount trees of %s: %w", name, err)
		}
	}
	return nil
}
