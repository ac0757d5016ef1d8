package areas

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// HostDir is a host directory the controller acts on, named by a tenant or
// reachable by an agent: Path, resolved beneath Anchor, a directory an
// administrator or the controller trusts (a SandboxClass's allowed root,
// the areas root, or "/" where nothing narrower applies).
//
// Every act on Path opens it afresh from a descriptor of Anchor with
// openat2 and then acts on that descriptor: symbolic links are followed
// only while they stay beneath Anchor (none at all with NoLinks), /proc
// magic links are refused, and the proc and sys pseudo-filesystems are
// refused as directories. A check of the directory and the act it allows
// are therefore always about one object, whatever an agent swaps in
// between two acts.
type HostDir struct {
	// Anchor is absolute and clean; "" means "/". It is trusted: it is
	// opened following its own links (an administrator's), never a magic
	// link.
	Anchor string `json:"anchor,omitempty"`
	// Path is absolute and clean, Anchor itself or below it.
	Path string `json:"path"`
	// NoLinks refuses every symbolic link between Anchor and Path, for a
	// directory an agent can reach from above (a mount source inside
	// another of the sandbox's read-write mounts, an area).
	NoLinks bool `json:"noLinks,omitempty"`
}

// ErrOutsideAnchor is wrapped when a HostDir's Path does not lie at or
// below its Anchor, even before anything is resolved.
var ErrOutsideAnchor = errors.New("the path does not lie below the directory it must be resolved beneath")

// ErrPseudoFS is wrapped when a directory turns out to be part of /proc or
// /sys, which no sandbox mount or file access may use.
var ErrPseudoFS = errors.New("the directory is on the proc or sys pseudo-filesystem, which is refused")

// anchor is d.Anchor with "" meaning "/".
func (d HostDir) anchor() string {
	if d.Anchor == "" {
		return "/"
	}
	return d.Anchor
}

// rel is Path relative to the anchor ("." for the anchor itself).
func (d HostDir) rel() (string, error) {
	a := d.anchor()
	if !filepath.IsAbs(a) || filepath.Clean(a) != a || !filepath.IsAbs(d.Path) || filepath.Clean(d.Path) != d.Path {
		return "", fmt.Errorf("host directory %q beneath %q: %w: both must be absolute, clean paths", d.Path, a, ErrInvalidPath)
	}
	if d.Path == a {
		return ".", nil
	}
	if a == "/" {
		return d.Path[1:], nil
	}
	rest, ok := strings.CutPrefix(d.Path, a+"/")
	if !ok {
		return "", fmt.Errorf("host directory %s: %w %s", d.Path, ErrOutsideAnchor, a)
	}
	return rest, nil
}

// String names the directory in messages.
func (d HostDir) String() string { return d.Path }

// AnchorFor returns the HostDir of path beneath the longest of anchors
// that holds it lexically, or ok false when none does. With no anchors,
// path is anchored at "/".
func AnchorFor(path string, anchors []string) (HostDir, bool) {
	path = filepath.Clean(path)
	if len(anchors) == 0 {
		return HostDir{Path: path}, true
	}
	best := ""
	for _, a := range anchors {
		a = filepath.Clean(a)
		if (a == "/" || path == a || strings.HasPrefix(path, a+"/")) && len(a) > len(best) {
			best = a
		}
	}
	if best == "" {
		return HostDir{}, false
	}
	if best == "/" {
		best = ""
	}
	return HostDir{Anchor: best, Path: path}, true
}

// Identity is the agent a Root acts as (Root.As): the host user and group
// whose permissions every access inside the root meets.
type Identity struct {
	UID, GID uint32
}
