package worktree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
)

// Reasons of a worktree's health; they are the GitHealthy condition reasons.
const (
	ReasonHealthy          = "Healthy"
	ReasonGitdirMissing    = "GitdirMissing"
	ReasonGitdirMismatch   = "GitdirMismatch"
	ReasonWorktreeLocked   = "WorktreeLocked"
	ReasonWorktreePrunable = "WorktreePrunable"
	ReasonHeadUnresolvable = "HeadUnresolvable"
)

// Health is what Check found.
type Health struct {
	Reason  string
	Message string
}

// Check reads a worktree's links from the host side, through the mount's
// contained root: the worktree's .git file must name the repository's
// worktrees/<name> directory, that directory's back-pointer must name the
// worktree, it must not be locked, and HEAD must resolve.
func Check(ctx context.Context, repo Repo, wt Worktree) Health {
	admin := repo.rel(".git", "worktrees", wt.Name)
	adminHost := filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name)

	dotGit, err := repo.Mount.Read(path.Join(wt.Rel, ".git"))
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
		return Health{ReasonGitdirMismatch, fmt.Sprintf("%s/.git names %s, not %s", wt.HostPath, target, adminHost)}
	}
	if _, err := repo.Mount.Lstat(admin); err != nil {
		return Health{ReasonGitdirMissing, fmt.Sprintf("the gitdir %s named by %s/.git is gone", adminHost, wt.HostPath)}
	}
	back, err := repo.Mount.Read(path.Join(admin, "gitdir"))
	if err != nil {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("reading the back-pointer %s/gitdir: %v", adminHost, err)}
	}
	backPath := strings.TrimSpace(string(back))
	if !filepath.IsAbs(backPath) {
		backPath = filepath.Join(adminHost, backPath)
	}
	if filepath.Clean(backPath) != filepath.Join(wt.HostPath, ".git") {
		return Health{ReasonGitdirMismatch, fmt.Sprintf("the back-pointer %s/gitdir names %s, not %s/.git", adminHost, backPath, wt.HostPath)}
	}
	if why, err := repo.Mount.Read(path.Join(admin, "locked")); err == nil {
		msg := fmt.Sprintf("worktree %s is locked", wt.HostPath)
		if s := strings.TrimSpace(string(why)); s != "" {
			msg += ": " + s
		}
		return Health{ReasonWorktreeLocked, msg}
	}
	if _, err := hostGit(ctx, repo, wt.HostPath, "rev-parse", "--verify", "--quiet", "HEAD^{commit}"); err != nil {
		return Health{ReasonHeadUnresolvable, fmt.Sprintf("HEAD of worktree %s does not resolve to a commit", wt.HostPath)}
	}
	return Health{ReasonHealthy, fmt.Sprintf("worktree %s is linked to %s and HEAD resolves", wt.HostPath, repo.GitCommonDir())}
}
