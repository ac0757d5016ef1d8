// Package worktree adds and removes the git worktree of a session inside an
// agent's mount, and checks its health.
//
// The host side never lets an agent's repository steer the controller.
// Host git runs in a bubblewrap jail that sees the system directories and
// the repository's mount only, as the agent's unprivileged identity, with a
// deadline, with hooks, fsmonitor, attribute files and transports off, and
// worktrees are added with --no-checkout, so no filter runs on the host; the
// checkout itself, which may run the repository's filters, happens inside
// the sandbox. Refs and names are checked against git's ref rules and passed
// after --end-of-options. Before git runs, the git files it reads are
// checked to be regular files (no links, no FIFOs) and the configuration to
// declare no filter, diff or merge driver and no include. The controller's
// own reads of git's files go through internal/areas and stop at a size
// limit, and removal deletes through it too, so a symbolic link planted in a
// worktree never leads the controller outside the mount. Git's own output
// never reaches a status: errors say in the product's words what failed and
// git's stderr goes to the controller log, bounded. Commits and branches are
// never removed.
package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
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
	// As is the agent's host identity. Host git runs as it, so git can do
	// to the repository no more than the agent can, and can read nothing
	// the agent cannot; zero (or root) means FallbackIdentity.
	As Identity
	// GitTimeout bounds each host git call; zero means DefaultGitTimeout.
	GitTimeout time.Duration
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
	// Two entries are enough to tell: the .git file and anything else.
	entries, err := repo.Mount.ListAtMost(wt.Rel, 2)
	if errors.Is(err, areas.ErrTooManyEntries) {
		return false, nil
	}
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

// ReasonRefUnresolvable says the spec's ref names no commit of the repository.
const ReasonRefUnresolvable = "RefUnresolvable"

// CheckSpec applies the rules of a worktree's name and ref again (the API
// server applies them at admission, and the name defaults to the claim's):
// both reach host git as arguments and the name becomes a directory.
func CheckSpec(spec Spec) error {
	if spec.Name == "" {
		return &Error{Reason: ReasonInvalidSpec, Message: "worktree name is empty"}
	}
	w := &v1alpha1.WorktreeSpec{Repository: "repository", Name: spec.Name, Ref: spec.Ref}
	if errs := v1alpha1.ValidateWorktree(w); len(errs) > 0 {
		return &Error{Reason: ReasonInvalidSpec, Message: clip(errs.ToAggregate().Error(), 1024)}
	}
	return nil
}

// ReasonInvalidSpec says the worktree's name or ref breaks a rule.
const ReasonInvalidSpec = v1alpha1.ReasonInvalidSpec

// Add adds the worktree without checking files out; Checkout does that
// inside the sandbox. Adding a worktree that exists already returns it.
func Add(ctx context.Context, repo Repo, spec Spec) (Worktree, error) {
	if err := CheckSpec(spec); err != nil {
		return Worktree{Name: spec.Name}, err
	}
	wt := For(repo, spec.Name)
	fi, err := repo.Mount.Lstat(repo.rel(".git"))
	if err != nil {
		return wt, fmt.Errorf("adding worktree %s: %s is not a git repository: %w", spec.Name, repo.HostPath(), err)
	}
	if !fi.IsDir() {
		return wt, fmt.Errorf("adding worktree %s: %s/.git is not a directory; the repository must be a main working tree, not a worktree or submodule", spec.Name, repo.HostPath())
	}
	if err := checkGitDir(repo); err != nil {
		return wt, err
	}
	if err := checkAdminDir(repo, spec.Name); err != nil {
		return wt, err
	}
	if err := excludeWorktreeDir(repo); err != nil {
		return wt, err
	}
	if _, err := repo.Mount.Lstat(wt.Rel); err == nil {
		// Already added. A lock or an unresolvable HEAD is the health
		// check's to report; broken links make it someone else's, and a
		// git directory host git must not read (or that held it up) is
		// no worktree to check out inside the sandbox either, where git
		// would read the same files.
		switch h := Check(ctx, repo, wt); h.Reason {
		case ReasonGitdirMissing, ReasonGitdirMismatch, ReasonWorktreePrunable:
			return wt, fmt.Errorf("adding worktree %s: %s exists but is not a worktree of %s: %s", spec.Name, wt.HostPath, repo.HostPath(), h.Message)
		case ReasonUnsafeRepository, ReasonGitTimedOut:
			return wt, &Error{Reason: h.Reason, Message: fmt.Sprintf("adding worktree %s: %s", spec.Name, h.Message)}
		}
		if full, err := describe(ctx, repo, wt); err == nil {
			return full, nil
		}
		return wt, nil
	}
	start := "HEAD"
	if spec.Ref != "" {
		// Resolved first, so worktree add only ever gets a ref that names a
		// commit, and a failure says so in words of its own.
		if _, err := hostGit(ctx, repo, repo.HostPath(), "rev-parse", "--verify", "--quiet", "--end-of-options", spec.Ref+"^{commit}"); err != nil {
			if ReasonOf(err) == ReasonGitFailed {
				return wt, &Error{Reason: ReasonRefUnresolvable, Message: fmt.Sprintf("adding worktree %s: ref %q names no commit in %s", spec.Name, spec.Ref, repo.HostPath())}
			}
			return wt, err
		}
		start = spec.Ref
	}
	// git makes Dir itself if it is missing, as the agent's identity, so
	// the agent owns it like the rest of its mount.
	args := []string{"worktree", "add", "--no-checkout"}
	switch {
	case spec.CreateBranch:
		args = append(args, "-b", spec.Name, "--end-of-options", wt.HostPath, start)
	case spec.Ref == "":
		args = append(args, "--detach", "--end-of-options", wt.HostPath, start)
	default:
		args = append(args, "--end-of-options", wt.HostPath, start)
	}
	if _, err := hostGit(ctx, repo, repo.HostPath(), args...); err != nil {
		return wt, err
	}
	return describe(ctx, repo, wt)
}

func describe(ctx context.Context, repo Repo, wt Worktree) (Worktree, error) {
	if err := checkAdminDir(repo, wt.Name); err != nil {
		return wt, err
	}
	dotGit, err := readBounded(repo.Mount, path.Join(wt.Rel, ".git"), MaxLinkFileSize)
	if err != nil {
		return wt, unsafeRepo("reading %s/.git: %v", wt.HostPath, err)
	}
	head, err := hostGit(ctx, repo, wt.HostPath, "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return wt, err
	}
	wt.Head = head
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
	old, err := readBounded(repo.Mount, excl, MaxConfigSize)
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

// clip shortens text that came from the agent or a tenant before it goes
// into a message, so no status or event carries more than a line of it.
func clip(s string, max int) string { return boundedbuf.Cut(s, max) }
