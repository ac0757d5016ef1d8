// Package worktree adds and removes the git worktree of a session inside an
// agent's mount, and checks its health.
//
// The host side never lets an agent's repository run code as the
// controller: worktrees are added with --no-checkout, hooks pointed at
// /dev/null and fsmonitor off, so no hook, filter or fsmonitor configured in
// the repository runs on the host; the checkout itself, which may run the
// repository's filters, happens inside the sandbox. Reads of git's files go
// through internal/areas, and removal deletes through it too, so a symbolic
// link planted in a worktree never leads the controller outside the mount.
// Commits and branches are never removed.
package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// Dir is the directory, inside the repository's working tree, that holds
// the sessions' worktrees. It is added to the repository's info/exclude so
// it never shows as untracked.
const Dir = ".worktrees"

// ErrDirty is returned by Remove for a worktree with uncommitted changes;
// the worktree is kept.
var ErrDirty = errors.New("worktree has uncommitted changes")

// Repo is a repository inside a mount: the mount's contained root and the
// repository's path relative to it.
type Repo struct {
	Mount *areas.Root
	// Rel is the repository's working tree relative to the mount ("" for the mount itself).
	Rel string
}

// HostPath is the repository's working tree on the host.
func (r Repo) HostPath() string { return filepath.Join(r.Mount.HostPath(), r.Rel) }

// GitCommonDir is the repository's git directory on the host.
func (r Repo) GitCommonDir() string { return filepath.Join(r.HostPath(), ".git") }

func (r Repo) rel(parts ...string) string { return path.Join(append([]string{r.Rel}, parts...)...) }

// Worktree is one session's worktree.
type Worktree struct {
	Name string
	// HostPath is the worktree's directory on the host.
	HostPath string
	// Rel is the worktree's directory relative to the mount.
	Rel          string
	GitCommonDir string
	Branch       string
	Head         string
	// Relative says the worktree's .git file names its git directory by a
	// relative path (git worktree add --relative-paths, git 2.48 and later).
	Relative bool
}

// For is where the worktree called name of repo lives; it reads nothing.
func For(repo Repo, name string) Worktree {
	wt := Worktree{Name: name, Rel: repo.rel(Dir, name), GitCommonDir: repo.GitCommonDir()}
	wt.HostPath = filepath.Join(repo.Mount.HostPath(), wt.Rel)
	return wt
}

// Untouched reports whether a worktree that was never checked out still
// holds nothing but its .git file, so removing it can lose no one's work.
func Untouched(repo Repo, wt Worktree) (bool, error) {
	entries, err := repo.Mount.List(wt.Rel)
	if err != nil {
		return false, fmt.Errorf("listing worktree %s: %w", wt.HostPath, err)
	}
	for _, e := range entries {
		if e.Name != ".git" {
			return false, nil
		}
	}
	return true, nil
}

// Spec says what to add.
type Spec struct {
	Name         string
	Ref          string
	CreateBranch bool
}

// Add adds the worktree without checking files out; Checkout does that
// inside the sandbox. Adding a worktree that exists already returns it.
func Add(ctx context.Context, repo Repo, spec Spec) (Worktree, error) {
	wt := For(repo, spec.Name)
	fi, err := repo.Mount.Lstat(repo.rel(".git"))
	if err != nil {
		return wt, fmt.Errorf("adding worktree %s: %s is not a git repository: %w", spec.Name, repo.HostPath(), err)
	}
	if !fi.IsDir() {
		return wt, fmt.Errorf("adding worktree %s: %s/.git is not a directory; the repository must be a main working tree, not a worktree or submodule", spec.Name, repo.HostPath())
	}
	if err := excludeWorktreeDir(repo); err != nil {
		return wt, err
	}
	if _, err := repo.Mount.Lstat(wt.Rel); err == nil {
		// Already added. A lock or an unresolvable HEAD is the health
		// check's to report; only broken links make it someone else's.
		switch h := Check(ctx, repo, wt); h.Reason {
		case ReasonGitdirMissing, ReasonGitdirMismatch, ReasonWorktreePrunable:
			return wt, fmt.Errorf("adding worktree %s: %s exists but is not a worktree of %s: %s", spec.Name, wt.HostPath, repo.HostPath(), h.Message)
		}
		if full, err := describe(ctx, repo, wt); err == nil {
			return full, nil
		}
		return wt, nil
	}
	if err := repo.Mount.Mkdir(repo.rel(Dir), false); err != nil && !errors.Is(err, fs.ErrExist) {
		return wt, fmt.Errorf("adding worktree %s: %w", spec.Name, err)
	}
	args := []string{"worktree", "add", "--no-checkout"}
	switch {
	case spec.CreateBranch:
		args = append(args, "-b", spec.Name, wt.HostPath)
		if spec.Ref != "" {
			args = append(args, spec.Ref)
		}
	case spec.Ref == "":
		args = append(args, "--detach", wt.HostPath, "HEAD")
	default:
		args = append(args, wt.HostPath, spec.Ref)
	}
	if _, err := hostGit(ctx, repo, repo.HostPath(), args...); err != nil {
		return wt, fmt.Errorf("adding worktree %s of %s: %w", spec.Name, repo.HostPath(), err)
	}
	return describe(ctx, repo, wt)
}

func describe(ctx context.Context, repo Repo, wt Worktree) (Worktree, error) {
	head, err := hostGit(ctx, repo, wt.HostPath, "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return wt, fmt.Errorf("reading HEAD of worktree %s: %w", wt.HostPath, err)
	}
	wt.Head = head
	dotGit, err := repo.Mount.Read(path.Join(wt.Rel, ".git"))
	if err != nil {
		return wt, fmt.Errorf("reading %s/.git: %w", wt.HostPath, err)
	}
	target, _ := strings.CutPrefix(strings.TrimSpace(string(dotGit)), "gitdir: ")
	wt.Relative = !filepath.IsAbs(target)
	if b, err := hostGit(ctx, repo, wt.HostPath, "symbolic-ref", "--quiet", "--short", "HEAD"); err == nil {
		wt.Branch = b
	}
	return wt, nil
}

// excludeWorktreeDir adds Dir to info/exclude once, so the sessions'
// worktrees never show as untracked files of the main working tree.
func excludeWorktreeDir(repo Repo) error {
	excl := repo.rel(".git", "info", "exclude")
	line := "/" + Dir + "/"
	old, err := repo.Mount.Read(excl)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reading %s/.git/info/exclude: %w", repo.HostPath(), err)
	}
	for _, l := range strings.Split(string(old), "\n") {
		if strings.TrimSpace(l) == line {
			return nil
		}
	}
	if err := repo.Mount.Mkdir(repo.rel(".git", "info"), false); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating %s/.git/info: %w", repo.HostPath(), err)
	}
	buf := bytes.NewBuffer(old)
	if len(old) > 0 && !bytes.HasSuffix(old, []byte("\n")) {
		buf.WriteByte('\n')
	}
	buf.WriteString("# session worktrees (sandbox-controller)\n" + line + "\n")
	if err := repo.Mount.Write(excl, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing %s/.git/info/exclude: %w", repo.HostPath(), err)
	}
	return nil
}

// Remove deletes a clean worktree's directory and its administrative
// directory in the repository. dirty says whether the worktree has
// uncommitted changes (found inside the sandbox, where the repository's own
// filters may run); a dirty worktree is kept and ErrDirty returned. The
// branch and its commits stay.
func Remove(repo Repo, wt Worktree, dirty bool) error {
	if dirty {
		return fmt.Errorf("keeping %s: %w", wt.HostPath, ErrDirty)
	}
	if err := repo.Mount.Remove(wt.Rel, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing worktree %s: %w", wt.HostPath, err)
	}
	admin := repo.rel(".git", "worktrees", wt.Name)
	if err := repo.Mount.Remove(admin, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the administrative files of worktree %s: %w", wt.HostPath, err)
	}
	return nil
}

// hostGit runs git for the controller with nothing of the repository that
// could execute (no hooks, no fsmonitor, no system or global configuration)
// and inside a bubblewrap jail in which only the repository's mount is
// writable: the git directory is also the sandbox's, so an agent may have
// planted symbolic links in it, and those must not lead a git running with
// the controller's privileges to write anywhere else on the host.
func hostGit(ctx context.Context, repo Repo, dir string, args ...string) (string, error) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return "", fmt.Errorf("git %s: the controller runs git in a bubblewrap jail and bwrap is not installed: install the bubblewrap package", strings.Join(args, " "))
	}
	mount := repo.Mount.HostPath()
	full := []string{
		"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
		"--bind", mount, mount,
		"--", "git",
		"-c", "core.hooksPath=/dev/null",
		"-c", "core.fsmonitor=false",
		"-c", "safe.directory=*",
		"-C", dir,
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, bwrap, full...)
	cmd.Env = []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=/nonexistent", "GIT_TERMINAL_PROMPT=0", "PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}
