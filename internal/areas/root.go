package areas

import (
	"fmt"
	"io/fs"
	"strings"
	"time"
)

// Root is one registered directory (an area or a mount source) that files
// are accessed beneath. It holds no descriptor between calls: each access
// resolves the directory again from its anchor (HostDir) and checks it is
// still the directory registered, so a root that is moved away and
// replaced is noticed instead of silently followed. A Root is safe for
// concurrent use.
type Root struct {
	name     string
	dir      HostDir
	readOnly bool
	// as, when set, is the agent every access below the root acts as.
	as *Identity
	// dev and ino identify the directory registered by OpenRoot.
	dev, ino uint64
	sys      sysCalls
}

// Name is the name the root was opened with; error messages use it.
func (r *Root) Name() string { return r.name }

// HostPath is the registered host directory.
func (r *Root) HostPath() string { return r.dir.Path }

// ReadOnly reports whether writes, mkdir and remove are refused.
func (r *Root) ReadOnly() bool { return r.readOnly }

// EntryType is the kind of a directory entry, as shown to clients.
type EntryType string

const (
	TypeFile    EntryType = "file"
	TypeDir     EntryType = "dir"
	TypeSymlink EntryType = "symlink"
	// TypeOther covers FIFOs, sockets and device nodes.
	TypeOther EntryType = "other"
)

// Entry describes one file. Symbolic links are described as links by List
// and Lstat, and by their target by Stat.
type Entry struct {
	Name    string      `json:"name"`
	Type    EntryType   `json:"type"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
}

// IsDir reports whether the entry is a directory.
func (e Entry) IsDir() bool { return e.Type == TypeDir }

func typeOf(m fs.FileMode) EntryType {
	switch {
	case m.IsRegular():
		return TypeFile
	case m.IsDir():
		return TypeDir
	case m&fs.ModeSymlink != 0:
		return TypeSymlink
	default:
		return TypeOther
	}
}

// checkRel validates a path given relative to a root. It does not clean the
// path: "a/../b" must be resolved by the kernel, because "a" may be a link.
func (r *Root) checkRel(op, rel string) (string, error) {
	if strings.IndexByte(rel, 0) >= 0 {
		return "", fmt.Errorf("%s %q in root %q: %w: the path contains a NUL byte", op, rel, r.name, ErrInvalidPath)
	}
	if strings.HasPrefix(rel, "/") {
		return "", fmt.Errorf("%s %q in root %q: %w: the path is absolute; paths are relative to the root", op, rel, r.name, ErrInvalidPath)
	}
	if rel == "" {
		return ".", nil
	}
	return rel, nil
}

// splitEntry splits rel into the directory that holds the entry and the
// entry's name, for operations that act on a name inside a directory
// descriptor. The name is never "", "." or "..": acting on ".." relative to
// a descriptor would reach outside what openat2 checked.
func (r *Root) splitEntry(op, rel string) (dir, name string, err error) {
	trimmed := strings.TrimRight(rel, "/")
	i := strings.LastIndexByte(trimmed, '/')
	dir, name = ".", trimmed
	if i >= 0 {
		dir, name = trimmed[:i+1], trimmed[i+1:]
	}
	if name == "" || name == "." || name == ".." {
		return "", "", fmt.Errorf("%s %q in root %q: %w: the path names the root or a \"..\" entry, not an entry inside a directory", op, rel, r.name, ErrInvalidPath)
	}
	return dir, name, nil
}

// components splits rel into its names, dropping empty and "." ones; ".."
// is kept for the kernel to resolve.
func components(rel string) []string {
	var out []string
	for _, c := range strings.Split(rel, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

func (r *Root) wrap(op, rel string, err error) error {
	return fmt.Errorf("%s %q in root %q: %w", op, rel, r.name, err)
}
