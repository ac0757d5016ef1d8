package areas

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Layout creates dir and one directory per name inside it, each only when
// missing. It never removes or replaces anything: an existing area keeps its
// files, and a symbolic link where a directory belongs is an error rather
// than something to follow or clear away. Directories it creates below the
// areas root belong to owner (uid and gid) when owner is not 0.
func Layout(dir string, names []string, owner uint32) error {
	if _, err := ensureDir(filepath.Dir(dir), true); err != nil {
		return err
	}
	if err := ensureOwnedDir(dir, owner); err != nil {
		return err
	}
	for _, n := range names {
		if err := ensureOwnedDir(filepath.Join(dir, n), owner); err != nil {
			return err
		}
	}
	return nil
}

func ensureOwnedDir(path string, owner uint32) error {
	fi, err := ensureDir(path, false)
	if err != nil {
		return err
	}
	if owner == 0 {
		return nil
	}
	// A directory that already belongs to the agent is left as it is: a
	// change of owner is a write of the inode even when nothing changes,
	// and the Sandbox reconciler lays the areas out at every pass.
	if ownedBy(fi, owner) {
		return nil
	}
	// Lchown: path was checked to be a directory above, but a link put in
	// its place since must not hand its target to the agent.
	if err := os.Lchown(path, int(owner), int(owner)); err != nil {
		return fmt.Errorf("laying out agent areas: giving %s to the agent's id %d: %w", path, owner, err)
	}
	return nil
}

// ensureDir makes path a directory when it is missing, and returns what
// it found there; nil when it made it.
func ensureDir(path string, parents bool) (fs.FileInfo, error) {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.IsDir():
		return fi, nil
	case err == nil:
		return nil, fmt.Errorf("laying out agent areas: %s exists and is not a directory (%s); refusing to use or replace it", path, fi.Mode().Type())
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("laying out agent areas: %w", err)
	}
	if parents {
		err = os.MkdirAll(path, 0o755)
	} else {
		err = os.Mkdir(path, 0o755)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("laying out agent areas: %w", err)
	}
	return nil, nil
}
