//go:build linux

package areas

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Staged is a new regular file written beside the place it is meant for and
// put there only by Commit. It lets a caller stream content of any size to
// disk (an upload, an overlay change) without holding it in memory, check
// what it wrote, and then either put it in place or throw it away leaving
// nothing behind.
//
// The directory the temporary file lives in is opened once, beneath the
// root, when staging starts; the temporary file is created inside that
// descriptor with O_EXCL and renamed inside it, so nothing the agent does to
// path names in between redirects the write.
type Staged struct {
	r   *Root
	rel string
	// dirfd is the deepest directory on the way to rel that existed when
	// staging started; the temporary file tmp is in it.
	dirfd int
	tmp   string
	// missing are the directories between dirfd and the file's name that
	// did not exist yet (only with parents); Commit creates them.
	missing []string
	name    string
	f       *os.File
	done    bool
}

// Stage starts writing a new regular file that Commit will put at rel,
// with exactly the permission bits perm. Without parents the directory that
// holds rel must exist; with parents, missing directories on the way are
// created by Commit, not before, so that an aborted file leaves no
// directory behind. A symbolic link at rel is replaced on Commit, never
// written through.
func (r *Root) Stage(rel string, perm fs.FileMode, parents bool) (*Staged, error) {
	return actV(r, func() (*Staged, error) { return r.stage(rel, perm, parents) })
}

// stage is the body of Stage, which runs it as the root's identity (act).
func (r *Root) stage(rel string, perm fs.FileMode, parents bool) (*Staged, error) {
	const op = "staging"
	if err := r.refuseReadOnly(op, rel); err != nil {
		return nil, err
	}
	if _, err := r.checkRel(op, rel); err != nil {
		return nil, err
	}
	if strings.HasSuffix(rel, "/") {
		return nil, r.wrap(op, rel, fmt.Errorf("%w: the path ends in \"/\" and so names a directory, not a file", ErrInvalidPath))
	}
	dir, name, err := r.splitEntry(op, rel)
	if err != nil {
		return nil, err
	}
	var dirfd int
	var missing []string
	if parents {
		dirfd, missing, err = r.deepestDir(op, rel, dir)
	} else {
		dirfd, err = r.at(op, rel, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	}
	if err != nil {
		return nil, err
	}
	tmp, tfd, err := createTemp(dirfd)
	if err != nil {
		unix.Close(dirfd)
		return nil, r.wrap(op, rel, fmt.Errorf("creating a temporary file beside it: %w", err))
	}
	s := &Staged{r: r, rel: rel, dirfd: dirfd, tmp: tmp, missing: missing, name: name, f: os.NewFile(uintptr(tfd), tmp)}
	if err := s.f.Chmod(perm.Perm()); err != nil {
		s.Abort()
		return nil, r.wrap(op, rel, fmt.Errorf("setting the mode: %w", err))
	}
	return s, nil
}

// deepestDir opens the deepest existing directory on the way to dir,
// beneath the root, and returns the components below it that are missing.
// A missing ".." cannot be created, so it is an error like any other.
func (r *Root) deepestDir(op, rel, dir string) (int, []string, error) {
	root, err := r.openRoot(op, rel)
	if err != nil {
		return -1, nil, err
	}
	defer unix.Close(root)
	cur, err := r.beneath(root, op, rel, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, nil, err
	}
	comps := components(dir)
	for i := range comps {
		fd, err := r.beneath(root, op, rel, strings.Join(comps[:i+1], "/"), unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil && errors.Is(err, unix.ENOENT) && !containsDotDot(comps[i:]) {
			return cur, comps[i:], nil
		}
		if err != nil {
			unix.Close(cur)
			return -1, nil, err
		}
		unix.Close(cur)
		cur = fd
	}
	return cur, nil, nil
}

func containsDotDot(comps []string) bool {
	for _, c := range comps {
		if c == ".." {
			return true
		}
	}
	return false
}

// Write appends to the staged file.
func (s *Staged) Write(p []byte) (int, error) { return s.f.Write(p) }

// Chown gives the staged file to uid and gid, through its descriptor.
func (s *Staged) Chown(uid, gid int) error {
	if err := s.f.Chown(uid, gid); err != nil {
		return s.r.wrap("staging", s.rel, fmt.Errorf("giving the file to %d:%d: %w", uid, gid, err))
	}
	return nil
}

// Commit puts the staged file at its place: it syncs the content, creates
// the missing directories (each opened without following a link before the
// next is made inside it) and renames the temporary file over the name.
// After Commit, Abort does nothing.
func (s *Staged) Commit() error {
	return s.r.act(s.commit)
}

func (s *Staged) commit() error {
	const op = "writing"
	if s.done {
		return s.r.wrap(op, s.rel, errors.New("the staged file was already committed or aborted"))
	}
	// Sync before the rename so that after a crash the name leads to the
	// old contents or the complete new ones.
	if err := s.f.Sync(); err != nil {
		s.Abort()
		return s.r.wrap(op, s.rel, fmt.Errorf("syncing: %w", err))
	}
	if err := s.f.Close(); err != nil {
		s.Abort()
		return s.r.wrap(op, s.rel, err)
	}
	parent, err := s.makeMissing()
	if err != nil {
		s.Abort()
		return s.r.wrap(op, s.rel, err)
	}
	defer func() {
		if parent != s.dirfd {
			unix.Close(parent)
		}
	}()
	if err := unix.Renameat(s.dirfd, s.tmp, parent, s.name); err != nil {
		s.Abort()
		return s.r.wrap(op, s.rel, fmt.Errorf("replacing the file: %w", err))
	}
	s.done = true
	defer unix.Close(s.dirfd)
	if err := unix.Fsync(parent); err != nil {
		return s.r.wrap(op, s.rel, fmt.Errorf("syncing the directory: %w", err))
	}
	return nil
}

// makeMissing creates the missing directories below dirfd and returns the
// descriptor of the file's directory (dirfd itself when none was missing).
func (s *Staged) makeMissing() (int, error) {
	cur := s.dirfd
	for _, c := range s.missing {
		if err := unix.Mkdirat(cur, c, dirMode); err != nil && !errors.Is(err, unix.EEXIST) {
			s.closeIfNotDir(cur)
			return -1, fmt.Errorf("creating directory %q: %w", c, err)
		}
		// O_NOFOLLOW: a link put in the directory's place since it was
		// made is refused, not descended into.
		fd, err := unix.Openat(cur, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		s.closeIfNotDir(cur)
		if err != nil {
			return -1, fmt.Errorf("opening directory %q: %w", c, err)
		}
		cur = fd
	}
	return cur, nil
}

func (s *Staged) closeIfNotDir(fd int) {
	if fd != s.dirfd {
		unix.Close(fd)
	}
}

// Abort removes the temporary file. It is safe to call more than once and
// after Commit, so callers defer it.
func (s *Staged) Abort() {
	if s.done {
		return
	}
	s.done = true
	s.f.Close()
	_ = s.r.act(func() error { return unix.Unlinkat(s.dirfd, s.tmp, 0) })
	unix.Close(s.dirfd)
}
