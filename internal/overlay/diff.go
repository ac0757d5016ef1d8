package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// Kind says what happened to a path.
type Kind string

const (
	Added   Kind = "added"
	Changed Kind = "changed"
	Deleted Kind = "deleted"
)

// Change is one path the sandbox changed, relative to the mount.
type Change struct {
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	// Dir is true for a directory added whole (or replaced, opaque).
	Dir bool `json:"dir,omitempty"`
}

// Diff lists what the upper layer changes against the lower one: added and
// changed files, deleted paths (overlayfs whiteouts), in path order.
func (l Layers) Diff() ([]Change, error) {
	var out []Change
	err := filepath.WalkDir(l.Upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(l.Upper, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		_, lowerErr := os.Lstat(filepath.Join(l.Lower, rel))
		inLower := lowerErr == nil
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case isWhiteout(fi):
			out = append(out, Change{Path: rel, Kind: Deleted})
		case fi.IsDir():
			if !inLower {
				out = append(out, Change{Path: rel, Kind: Added, Dir: true})
			}
		case inLower:
			out = append(out, Change{Path: rel, Kind: Changed})
		default:
			out = append(out, Change{Path: rel, Kind: Added})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the changes of overlay %s: %w", l.Upper, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// isWhiteout: overlayfs marks a deleted lower path with a 0:0 character device.
func isWhiteout(fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// Apply writes the changes back to the lower layer through a contained root
// on it: files are written atomically, deletions removed; a symbolic link in
// the upper layer is reported, never followed or copied. It returns what it
// applied; afterwards the upper layer still holds the changes, so a
// re-applied diff is harmless.
func (l Layers) Apply(lower *areas.Root) ([]Change, error) {
	changes, err := l.Diff()
	if err != nil {
		return nil, err
	}
	upper, err := areas.OpenRoot("upper", l.Upper, true)
	if err != nil {
		return nil, fmt.Errorf("applying overlay %s: %w", l.Upper, err)
	}
	var applied []Change
	for _, c := range changes {
		switch {
		case c.Kind == Deleted:
			if err := lower.Remove(c.Path, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return applied, fmt.Errorf("applying the deletion of %s: %w", c.Path, err)
			}
		case c.Dir:
			if err := lower.Mkdir(c.Path, true); err != nil && !errors.Is(err, fs.ErrExist) {
				return applied, fmt.Errorf("applying directory %s: %w", c.Path, err)
			}
		default:
			// Read through a contained root: the sandbox can still change
			// the upper layer through the merged view while this runs.
			e, err := upper.Lstat(c.Path)
			if err != nil {
				return applied, fmt.Errorf("applying %s: %w", c.Path, err)
			}
			if e.Type != areas.TypeFile {
				return applied, fmt.Errorf("applying %s: only regular files are applied, this is a %s", c.Path, e.Type)
			}
			data, err := upper.Read(c.Path)
			if err != nil {
				return applied, fmt.Errorf("applying %s: %w", c.Path, err)
			}
			if dir := path.Dir(c.Path); dir != "." {
				if err := lower.Mkdir(dir, true); err != nil && !errors.Is(err, fs.ErrExist) {
					return applied, fmt.Errorf("applying %s: %w", c.Path, err)
				}
			}
			if err := lower.Write(c.Path, data, e.Mode.Perm()); err != nil {
				return applied, fmt.Errorf("applying %s: %w", c.Path, err)
			}
		}
		applied = append(applied, c)
	}
	return applied, nil
}
