package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// Kind says what happened to a path.
type Kind string

const (
	Added   Kind = "added"
	Changed Kind = "changed"
	Deleted Kind = "deleted"
)

// TypeWhiteout is the Type of a deleted path: overlayfs marks it in the
// upper layer with a 0:0 character device.
const TypeWhiteout areas.EntryType = "whiteout"

// Change is one path the sandbox changed, relative to the mount.
type Change struct {
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	// Dir is true for a directory added whole.
	Dir bool `json:"dir,omitempty"`
	// Type is what the upper layer holds at Path: a file, a directory, a
	// whiteout (Deleted), or a link or special file, which Apply refuses.
	Type areas.EntryType `json:"type"`
	// Mode and SHA256 are a file's permission bits and the hex SHA-256 of
	// its content, as read from one open descriptor.
	Mode   fs.FileMode `json:"mode,omitempty"`
	SHA256 string      `json:"sha256,omitempty"`
}

// Digest is a stable SHA-256 over a canonical listing of changes: one line
// per change, in the order given (Diff's path order), with its kind, type,
// mode, content hash and quoted path. Quoting keeps a name holding a
// newline from passing for two changes. A reviewer who saw a digest knows
// the exact paths, kinds, modes and contents Apply with it will write.
func Digest(changes []Change) string {
	h := sha256.New()
	_, _ = io.WriteString(h, "sandbox-controller overlay changes v1\n")
	for _, c := range changes {
		sum := c.SHA256
		if sum == "" {
			sum = "-"
		}
		fmt.Fprintf(h, "%s %s %04o %s %s\n", c.Kind, c.Type, uint32(c.Mode.Perm()), sum, strconv.Quote(c.Path))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// ErrDigestMismatch is wrapped when the upper layer no longer holds the
// changes a digest was given for.
var ErrDigestMismatch = errors.New("the overlay's changes differ from the reviewed ones")

// Diff lists what the upper layer changes against the lower one: added and
// changed files with their modes and content hashes, added directories,
// deleted paths (overlayfs whiteouts), in path order. Every file is read
// through a root on the upper layer (internal/areas) and hashed as it
// streams, so a huge or sparse file costs time, never memory.
func (l Layers) Diff() ([]Change, error) {
	lower, err := areas.OpenRootAt("lower layer", l.LowerDir(), true)
	if err != nil {
		return nil, fmt.Errorf("listing the changes of overlay %s: %w", l.Upper, err)
	}
	return l.scan(lower, func(_ *Change, f *os.File) (string, error) {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	})
}

// scan walks the upper layer, in path order, and describes every change.
// For each regular file it opens the file once beneath the upper layer,
// takes the mode from that descriptor and lets content read it and return
// its hash.
func (l Layers) scan(lower *areas.Root, content func(c *Change, f *os.File) (string, error)) ([]Change, error) {
	// A stopped instance's sized upper layer is not mounted.
	if err := l.mountDisk(); err != nil {
		return nil, fmt.Errorf("listing the changes of overlay %s: %w", l.Upper, err)
	}
	upper, err := areas.OpenRootAt("upper layer", l.UpperDir(), true)
	if err != nil {
		return nil, fmt.Errorf("listing the changes of overlay %s: %w", l.Upper, err)
	}
	// The upper layer is the agent's writing: it is read as the agent.
	upper = upper.As(areas.Identity{UID: l.Owner, GID: l.Owner})
	var out []Change
	var walk func(dir string) error
	walk = func(dir string) error {
		entries, err := upper.List(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			rel := e.Name
			if dir != "" {
				rel = dir + "/" + e.Name
			}
			_, lowerErr := lower.Lstat(rel)
			kind := Added
			if lowerErr == nil {
				kind = Changed
			}
			c := Change{Path: rel, Kind: kind, Type: e.Type}
			switch e.Type {
			case areas.TypeDir:
				if lowerErr != nil {
					c.Dir = true
					out = append(out, c)
				}
				if err := walk(rel); err != nil {
					return err
				}
				continue
			case areas.TypeFile:
				if err := fileChange(upper, &c, content); err != nil {
					return err
				}
			case areas.TypeOther:
				white, err := isWhiteout(upper, dir, e.Name)
				if err != nil {
					return err
				}
				if white {
					c.Kind, c.Type = Deleted, TypeWhiteout
				}
			}
			out = append(out, c)
		}
		return nil
	}
	if err := walk(""); err != nil {
		return nil, fmt.Errorf("listing the changes of overlay %s: %w", l.Upper, err)
	}
	return out, nil
}

func fileChange(upper *areas.Root, c *Change, content func(c *Change, f *os.File) (string, error)) error {
	f, err := upper.Open(c.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%q: %w", c.Path, err)
	}
	c.Mode = fi.Mode().Perm()
	if c.SHA256, err = content(c, f); err != nil {
		return fmt.Errorf("reading %q: %w", c.Path, err)
	}
	return nil
}

// isWhiteout reports whether name in dir is a 0:0 character device. It
// looks through a handle of dir opened beneath the upper layer, so the
// check is about the entry in that directory, not a path.
func isWhiteout(upper *areas.Root, dir, name string) (bool, error) {
	d, err := upper.OpenDir(dir)
	if err != nil {
		return false, err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, fmt.Errorf("%q: %w", path.Join(dir, name), err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0, nil
}

// Apply writes the changes back to the lower layer, through a contained
// root on it, provided they are exactly the ones reviewed: digest is what
// Digest gave for the Diff the reviewer saw.
//
// Every file is read once from a descriptor opened beneath the upper layer,
// hashed as it is copied to a temporary file in the lower layer, and the
// digest is computed over what was copied. Only when it equals digest is
// anything put in place; otherwise the temporary files are removed and
// nothing in the lower layer has changed. So the sandbox changing its
// upper layer after the review, even while Apply reads it, is refused.
// A symbolic link or special file among the changes is refused too, never
// followed or copied. It returns what it applied; afterwards the upper
// layer still holds the changes, so a re-applied diff is harmless.
func (l Layers) Apply(lower *areas.Root, digest string) ([]Change, error) {
	if digest == "" {
		return nil, fmt.Errorf("applying overlay %s: a digest of the reviewed changes is required", l.Upper)
	}
	staged := map[string]*areas.Staged{}
	defer func() {
		for _, s := range staged {
			s.Abort()
		}
	}()
	changes, err := l.scan(lower, func(c *Change, f *os.File) (string, error) {
		s, err := lower.Stage(c.Path, c.Mode, true)
		if err != nil {
			return "", err
		}
		staged[c.Path] = s
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(s, h), f); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("applying overlay %s: %w", l.Upper, err)
	}
	if got := Digest(changes); got != digest {
		return nil, fmt.Errorf("applying overlay %s: %w: they now have digest %s, not the reviewed %s; nothing was applied, review them again with diff", l.Upper, ErrDigestMismatch, got, digest)
	}
	for _, c := range changes {
		if c.Type != areas.TypeFile && c.Type != areas.TypeDir && c.Type != TypeWhiteout {
			return nil, fmt.Errorf("applying %q: only regular files, directories and deletions are applied, this is a %s; nothing was applied", c.Path, c.Type)
		}
	}
	var applied []Change
	for _, c := range changes {
		switch c.Type {
		case TypeWhiteout:
			if err := lower.Remove(c.Path, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return applied, fmt.Errorf("applying the deletion of %q: %w", c.Path, err)
			}
		case areas.TypeDir:
			if err := lower.Mkdir(c.Path, true); err != nil && !errors.Is(err, fs.ErrExist) {
				return applied, fmt.Errorf("applying directory %q: %w", c.Path, err)
			}
		case areas.TypeFile:
			err := staged[c.Path].Commit()
			delete(staged, c.Path)
			if err != nil {
				return applied, fmt.Errorf("applying %q: %w", c.Path, err)
			}
		}
		applied = append(applied, c)
	}
	return applied, nil
}
