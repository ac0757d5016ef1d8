package incus

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
	"github.com/cireilclaw/sandbox-controller/runtimes/mounttree"
)

// Incus binds a disk device's source by path, when the instance starts and
// whenever the device changes, as root. A mount source a tenant named, or
// an area below an agent's directory, is a path an agent can redirect
// between the controller's check and that bind. So the daemon is never
// given one: the driver resolves each source as a held directory
// (runtimes.Instance.SourceDir), binds it, nosuid and nodev, at a
// directory of its own below Config.HeldDir, and gives the daemon that
// path. A bind of a nosuid mount is nosuid too, so no setuid file in an
// area or mount counts inside the container.

// DefaultHeldDir holds the binds when Config.HeldDir is empty.
const DefaultHeldDir = "/run/sandbox-controller/incus-sources"

// heldPath is where the source of bind b of instance name is held: named
// after the device and the source, so a new source is a new device
// source and the daemon remounts it.
func (r *Runtime) heldPath(name string, b runtimes.Bind) string {
	sum := sha256.Sum256([]byte(b.Anchor + "\x00" + b.Source))
	return filepath.Join(r.cfg.HeldDir, name, DeviceName(b.Target)+"-"+hex.EncodeToString(sum[:4]))
}

// devices are the instance's devices with every disk's source held.
func (r *Runtime) devices(in runtimes.Instance) (map[string]incusapi.Device, error) {
	want, err := Devices(in)
	if err != nil {
		return nil, err
	}
	for _, b := range slices.Concat(in.Areas, in.Mounts) {
		if d, ok := want[DeviceName(b.Target)]; ok && !b.GitDir {
			d["source"] = r.heldPath(in.Name, b)
		}
	}
	return want, nil
}

// holdSources binds every source of in at its held path (keeping a bind
// that still holds the source as it resolves now) and removes the binds
// of sources in no longer has.
func (r *Runtime) holdSources(in runtimes.Instance) error {
	dir := filepath.Join(r.cfg.HeldDir, in.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	keep := map[string]bool{}
	for _, b := range slices.Concat(in.Areas, in.Mounts) {
		if b.GitDir {
			continue
		}
		p := r.heldPath(in.Name, b)
		keep[filepath.Base(p)] = true
		src := in.SourceDir(b)
		if mounttree.Holds(p, src) {
			continue
		}
		if err := mounttree.BindAt(src, p, b.ReadOnly); err != nil {
			return fmt.Errorf("holding the source of %s: %w", b.Target, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			if err := mounttree.Unbind(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// releaseSources detaches the held sources of a stopped or deleted
// instance; the container no longer uses them.
func (r *Runtime) releaseSources(name string) error {
	dir := filepath.Join(r.cfg.HeldDir, name)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := mounttree.Unbind(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// release is releaseSources as an error of op.
func (r *Runtime) release(op, name string) error {
	if err := r.releaseSources(name); err != nil {
		return runtimes.Errorf(runtimes.ReasonFailed, op, name, "%w", err)
	}
	return nil
}
