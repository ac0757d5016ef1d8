package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLinks is how many symbolic links ownPath follows in one path, as the
// kernel does.
const maxLinks = 40

// ownPath resolves path, following its links once, and makes sure that
// nobody but root and this process's user can change what it names: every
// directory and link on the way is owned by one of the two, no directory
// is writable by anyone else unless it is sticky (then no one else can
// rename or remove what the two own in it), and the last one that exists
// is writable by no one else at all, so that no one else can make what is
// missing below it or change the file itself. It returns the resolved
// path, which holds no link: use it, not path, from then on.
//
// sandboxctl, run as root, reads the instance records of its state
// directory and acts on what they name (mounts, cgroups), lays out areas
// below the areas root and runs what the configuration says: whoever could
// change one of them would have root act for them.
func ownPath(what, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w", what, path, err)
	}
	uid := uint32(os.Geteuid())
	refuse := func(name, why string) error {
		return fmt.Errorf("%s %s: %s %s, so another user could change what sandboxctl (uid %d) reads and acts on there: make it %s's own, writable by nobody else", what, path, name, why, uid, map[bool]string{true: "root", false: "your user"}[uid == 0])
	}
	check := func(name string, st *unix.Stat_t) error {
		if st.Uid != 0 && st.Uid != uid {
			return refuse(name, fmt.Sprintf("belongs to uid %d, neither root nor uid %d", st.Uid, uid))
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return refuse(name, fmt.Sprintf("is writable by others (mode %04o)", st.Mode&0o7777))
		}
		return nil
	}
	cur := "/"
	var st unix.Stat_t
	if err := unix.Lstat(cur, &st); err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	if err := check(cur, &st); err != nil {
		return "", err
	}
	rest, links := strings.Split(abs, "/"), 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			if err := unix.Lstat(cur, &st); err != nil {
				return "", fmt.Errorf("%s %s: %w", what, path, err)
			}
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", fmt.Errorf("%s %s: %s is not a directory", what, path, cur)
		}
		next := filepath.Join(cur, c)
		var nst unix.Stat_t
		err := unix.Lstat(next, &nst)
		if errors.Is(err, unix.ENOENT) {
			// The rest is made (or, for a configuration, read as the
			// defaults) later: no one else may make it first.
			if st.Mode&0o022 != 0 {
				return "", refuse(cur, fmt.Sprintf("is writable by others (mode %04o), and %s is missing in it", st.Mode&0o7777, c))
			}
			return filepath.Join(append([]string{next}, rest...)...), nil
		}
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", what, path, err)
		}
		if err := check(next, &nst); err != nil {
			return "", err
		}
		if nst.Mode&unix.S_IFMT == unix.S_IFLNK {
			if links++; links > maxLinks {
				return "", fmt.Errorf("%s %s: %w", what, path, unix.ELOOP)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", fmt.Errorf("%s %s: %w", what, path, err)
			}
			if filepath.IsAbs(target) {
				cur = "/"
				if err := unix.Lstat(cur, &st); err != nil {
					return "", fmt.Errorf("%s %s: %w", what, path, err)
				}
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		cur, st = next, nst
	}
	if st.Mode&0o022 != 0 {
		return "", refuse(cur, fmt.Sprintf("is writable by others (mode %04o)", st.Mode&0o7777))
	}
	return cur, nil
}

// trust resolves the configuration, the areas root and the state
// directory with ownPath, once, and uses what they resolved to from then
// on.
func (f *sandboxFlags) trust() error {
	if f.trusted {
		return nil
	}
	if f.areasRoot == "" {
		return fmt.Errorf("areas root %q: give an absolute directory with --areas-root", f.areasRoot)
	}
	root, err := ownPath("areas root", f.areasRoot)
	if err != nil {
		return err
	}
	state := f.stateDir
	if state == "" {
		// Beside the agents' directories, never inside one: an agent name
		// cannot begin with a dot.
		state = filepath.Join(root, ".sandboxctl")
	}
	if state, err = ownPath("state directory", state); err != nil {
		return err
	}
	if f.config != "" {
		if f.config, err = ownPath("sandbox configuration", f.config); err != nil {
			return err
		}
	}
	f.areasRoot, f.stateDir, f.trusted = root, state, true
	return nil
}
