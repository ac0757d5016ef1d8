//go:build !linux

package areas

import "io/fs"

// Staged is a file being written beside its place; off Linux none can be.
type Staged struct{}

func (r *Root) Stage(rel string, perm fs.FileMode, parents bool) (*Staged, error) {
	return nil, r.unsupported("staging", rel)
}

func (s *Staged) Write(p []byte) (int, error) { return 0, ErrUnsupportedPlatform }

func (s *Staged) Chown(uid, gid int) error { return ErrUnsupportedPlatform }

func (s *Staged) Commit() error { return ErrUnsupportedPlatform }

func (s *Staged) Abort() {}
