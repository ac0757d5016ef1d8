package runtimes

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// The git directories of worktrees (binds marked GitDir) lie inside one of
// the sandbox's read-write mounts, where the agent can write: between two
// commands it could replace a repository's .git with a symbolic link to
// anywhere on the host. So no driver binds a git directory by its path.
// Each is opened beneath its mount's root (internal/areas: no link may lead
// out of the mount) and bound from that handle, so what is bound is what
// was checked.

// GitDir is an opened git directory bind.
type GitDir struct {
	Bind Bind
	// Dir is an O_PATH handle on the directory; the caller closes it.
	Dir *os.File
}

// GitDirBinds are the instance's git directory binds.
func (in Instance) GitDirBinds() []Bind {
	var out []Bind
	for _, b := range in.Mounts {
		if b.GitDir {
			out = append(out, b)
		}
	}
	return out
}

// OpenGitDir opens one git directory bind beneath the read-write mount that
// holds it.
func (in Instance) OpenGitDir(b Bind) (*os.File, error) {
	for _, m := range in.Mounts {
		if m.GitDir || m.ReadOnly || !strings.HasPrefix(b.Source, m.Source+"/") {
			continue
		}
		root, err := areas.OpenRootAt(m.Target, in.SourceDir(m), false)
		if err != nil {
			return nil, fmt.Errorf("git directory %s: %w", b.Source, err)
		}
		f, err := root.OpenDir(strings.TrimPrefix(b.Source, m.Source+"/"))
		if err != nil {
			return nil, fmt.Errorf("git directory %s: %w", b.Source, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("git directory %s is inside none of the sandbox's read-write mounts", b.Source)
}

// OpenGitDirs opens every git directory bind. One that cannot be opened
// (gone, or a link out of its mount) is left out and reported in errs:
// the worktree's git fails inside the sandbox and its claim says so, while
// the other binds and the sandbox's commands go on.
func (in Instance) OpenGitDirs() (dirs []GitDir, errs []error) {
	for _, b := range in.GitDirBinds() {
		f, err := in.OpenGitDir(b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dirs = append(dirs, GitDir{Bind: b, Dir: f})
	}
	return dirs, errs
}

// CloseGitDirs closes the handles.
func CloseGitDirs(dirs []GitDir) {
	for _, d := range dirs {
		d.Dir.Close()
	}
}

// DiffGitDirs are the git directory binds new has and old has not, and
// those old has and new has not.
func DiffGitDirs(old, new Instance) (added, removed []Bind) {
	o, n := old.GitDirBinds(), new.GitDirBinds()
	return missingFrom(n, o), missingFrom(o, n)
}

func missingFrom(a, b []Bind) []Bind {
	var out []Bind
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y Bind) bool { return x.Source == y.Source && x.Target == y.Target && x.ReadOnly == y.ReadOnly }) {
			out = append(out, x)
		}
	}
	return out
}
