//go:build !linux

package areas

import (
	"fmt"
	"os"
)

// sysCalls is empty: without openat2 there is nothing to call.
type sysCalls struct{}

// OpenRoot always fails off Linux: contained access needs openat2, and
// there is deliberately no fallback.
func OpenRoot(name, hostPath string, readOnly bool) (*Root, error) {
	return nil, fmt.Errorf("opening root %q: %w", name, ErrUnsupportedPlatform)
}

// OpenRootAt always fails off Linux, as OpenRoot does.
func OpenRootAt(name string, dir HostDir, readOnly bool) (*Root, error) {
	return nil, fmt.Errorf("opening root %q: %w", name, ErrUnsupportedPlatform)
}

// As returns r: off Linux no Root is ever opened.
func (r *Root) As(Identity) *Root { return r }

// Open always fails off Linux.
func (d HostDir) Open() (*os.File, error) {
	return nil, fmt.Errorf("host directory %s: %w", d.Path, ErrUnsupportedPlatform)
}

func (r *Root) unsupported(op, rel string) error {
	return r.wrap(op, rel, ErrUnsupportedPlatform)
}

func (r *Root) Open(rel string) (*os.File, error) { return nil, r.unsupported("opening", rel) }

func (r *Root) Read(rel string) ([]byte, error) { return nil, r.unsupported("reading", rel) }

func (r *Root) OpenDir(rel string) (*os.File, error) {
	return nil, r.unsupported("opening directory", rel)
}

func (r *Root) Stat(rel string) (Entry, error) { return Entry{}, r.unsupported("stat", rel) }

func (r *Root) Lstat(rel string) (Entry, error) { return Entry{}, r.unsupported("lstat", rel) }

func (r *Root) List(rel string) ([]Entry, error) { return nil, r.unsupported("listing", rel) }

// Each always fails off Linux.
func (r *Root) Each(rel string, _ int, _ func([]Entry) error) error {
	return r.unsupported("listing", rel)
}

// ListAtMost always fails off Linux.
func (r *Root) ListAtMost(rel string, _ int) ([]Entry, error) {
	return nil, r.unsupported("listing", rel)
}

func (r *Root) Write(rel string, data []byte, perm os.FileMode) error {
	return r.unsupported("writing", rel)
}

func (r *Root) Mkdir(rel string, parents bool) error {
	return r.unsupported("making directory", rel)
}

func (r *Root) Remove(rel string, recursive bool) error { return r.unsupported("removing", rel) }

// Remove removes the file or directory at a sandbox path.
func (v *View) Remove(sandboxPath string, recursive bool) error {
	root, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return err
	}
	return root.Remove(rel, recursive)
}

// RealPath always fails off Linux.
func RealPath(path string) (string, error) { return "", ErrUnsupportedPlatform }
