package worktree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// Reasons of a worktree's health: the API's GitHealthy condition reasons.
const (
	ReasonHealthy          = v1alpha1.ReasonHealthy
	ReasonGitdirMissing    = v1alpha1.ReasonGitdirMissing
	ReasonGitdirMismatch   = v1alpha1.ReasonGitdirMismatch
	ReasonWorktreeLocked   = v1alpha1.ReasonWorktreeLocked
	ReasonWorktreePrunable = v1alpha1.ReasonWorktreePrunable
	ReasonHeadUnresolvable = v1alpha1.ReasonHeadUnresolvable
)

// Health is what Check found.
type Health struct {
	Reason  string
	Message string
}

// Check reads a worktree's links from the host side, through the mount's
// contained root and within MaxLinkFileSize: the worktree's .git file must
// name the repository's worktrees/<name> directory, that directory's
// back-pointer must name the worktree, and its commondir the repository's
// git directory; it must not be locked, the git files host git reads must
// be regular files, and HEAD must resolve. Text read from the agent's
// files appears in a message quoted and clipped to a line.
func Check(ctx context.Context, repo Repo, wt Worktree) Health {
	admin := repo.rel(".git", "worktrees", wt.Name)
	adminHost := filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name)

	dotGit, err := readBounded(repo.Mount, path.Join(wt.Rel, ".git"), MaxLinkFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		if _, aerr := repo.Mount.Lstat(admin); aerr == nil {
			return Health{ReasonWorktreePrunable, fmt.Sprintf("worktree %s is gone but %s still records it; git would prune it", wt.HostPath, adminHost)}
		}
		return Health{ReasonGitdirMissing, fmt.Sprintf("worktree %s has no .git file", wt.HostPath)}
	}
	if err != nil {
		return Health{ReasonGitdirMissing, fmt.Sprintf("reading %s/.git: %v", wt.HostPath, err)}
	}
	target, ok := strings.CutPrefix(strings.TrimSpace(string(dotGit)), "gitdir: ")
	if !ok {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("%s/.git does not name a gitdir", wt.HostPath)}
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(wt.HostPath, target)
	}
	if filepath.Clean(target) != adminHost {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("%s/.git names %s, not %s", wt.HostPath, quote(target), adminHost)}
	}
	if _, err := repo.Mount.Lstat(admin); err != nil {
		return Health{ReasonGitdirMissing, fmt.Sprintf("the gitdir %s named by %s/.git is gone", adminHost, wt.HostPath)}
	}
	if err := checkAdminDir(repo, wt.Name); err != nil {
		return Health{ReasonUnsafeRepository, err.Error()}
	}
	back, err := readBounded(repo.Mount, path.Join(admin, "gitdir"), MaxLinkFileSize)
	if err != nil {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("reading the back-pointer %s/gitdir: %v", adminHost, err)}
	}
	backPath := strings.TrimSpace(string(back))
	if !filepath.IsAbs(backPath) {
		backPath = filepath.Join(adminHost, backPath)
	}
	if filepath.Clean(backPath) != filepath.Join(wt.HostPath, ".git") {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("the back-pointer %s/gitdir names %s, not %s/.git", adminHost, quote(backPath), wt.HostPath)}
	}
	if common, err := readBounded(repo.Mount, path.Join(admin, "commondir"), MaxLinkFileSize); err == nil {
		c := strings.TrimSpace(string(common))
		if !filepath.IsAbs(c) {
			c = filepath.Join(adminHost, c)
		}
		if filepath.Clean(c) != repo.GitCommonDir() {
			return Health{ReasonGitdirMismatch, fmt.Sprintf("%s/commondir names %s, not %s", adminHost, quote(c), repo.GitCommonDir())}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("reading %s/commondir: %v", adminHost, err)}
	}
	if why, err := readBounded(repo.Mount, path.Join(admin, "locked"), MaxLinkFileSize); err == nil {
		msg := fmt.Sprintf("worktree %s is locked", wt.HostPath)
		if s := strings.TrimSpace(string(why)); s != "" {
			msg += ": " + quote(s)
		}
		return Health{ReasonWorktreeLocked, msg}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Health{ReasonUnsafeRepository, fmt.Sprintf("reading %s/locked: %v", adminHost, err)}
	}
	if err := checkGitDir(repo); err != nil {
		return Health{ReasonUnsafeRepository, err.Error()}
	}
	if _, err := hostGit(ctx, repo, wt.HostPath, "rev-parse", "--verify", "--quiet", "HEAD^{commit}"); err != nil {
		if r := ReasonOf(err); r == ReasonGitTimedOut {
			return Health{r, err.Error()}
		}
		return Health{ReasonHeadUnresolvable, fmt.Sprintf("HEAD of worktree %s does not resolve to a commit", wt.HostPath)}
	}
	return Health{ReasonHealthy, fmt.Sprintf("worktree %s is linked to %s and HEAD resolves", wt.HostPath, repo.GitCommonDir())}
}

// quote shows text read from an agent's file: quoted, so control
// characters cannot forge lines, and clipped.
func quote(s string) string {
	return strconv.Quote(clip(s, 200))
}
