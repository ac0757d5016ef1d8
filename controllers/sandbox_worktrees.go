package controllers

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// The worktree handshake has two sides, each in one file, each writing
// only its own object's status and reading one fact of the other's:
//
//   - The claim (sessionclaim_worktree.go) adds its worktree with host git
//     and publishes where its repository's git directory is
//     (status.worktree.gitCommonDir), unless the worktree links to it by
//     relative paths, which resolve through the repository's own mount.
//     Once the Sandbox is Ready and mounts that directory it checks the
//     worktree out and probes it inside the sandbox: its own worktree's
//     git, in the instance of that name, as the agent.
//   - The Sandbox (this file) binds those git directories, each at its host
//     path and only inside one of its read-write mounts, and publishes
//     what its running instance mounts (status.mountedGitDirs). A directory
//     stays bound until the instance stops, after its last claim is gone:
//     it is a second path to files of a read-write mount the agent has
//     anyway, and unbinding it while a claim of the same repository read
//     the older status would have that claim check out with the directory
//     away. It runs nothing inside the sandbox for a claim. Its GitHealthy
//     summarises its claims' GitHealthy.
//
// Each side is woken only by the other's fact (predicates.go): a claim by
// mountedGitDirs and Ready, a Sandbox by gitCommonDir, relativePaths and
// GitHealthy.

// gitDirsToBind are the git directories the claims' worktrees need at
// their host paths, and those the running instance mounts already
// (mounted, from the status of a Ready Sandbox). A relative worktree needs
// none: its links resolve through the repository's mount, and the sandbox
// never learns the host path.
func gitDirsToBind(claims []v1alpha1.SessionClaim, mounted []string) []string {
	dirs := slices.Clone(mounted)
	for _, c := range claims {
		if wt := c.Status.Worktree; wt != nil && wt.GitCommonDir != "" && !wt.RelativePaths {
			dirs = append(dirs, wt.GitCommonDir)
		}
	}
	return dirs
}

type gitHealth struct {
	healthy         bool
	reason, message string
}

// maxGitSummary bounds the Sandbox's GitHealthy message: the API refuses
// a status whose condition message is over 32768 bytes, and a tenant makes
// as many claims as it likes, each with a message up to
// maxConditionMessage.
const maxGitSummary = 8 * maxConditionMessage

// gitSummary is the Sandbox's GitHealthy from its live claims' worktrees;
// nil when none has a worktree. It names the unhealthy claims within
// maxGitSummary and counts the rest.
func gitSummary(claims []v1alpha1.SessionClaim) *gitHealth {
	var total, unhealthy, size int
	var bad []string
	reason := v1alpha1.ReasonHealthy
	for _, c := range claims {
		if c.Spec.Worktree == nil || !c.DeletionTimestamp.IsZero() {
			continue
		}
		total++
		cond := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionGitHealthy)
		if cond == nil || cond.Status != metav1.ConditionTrue {
			r, m := "Unknown", "not checked yet"
			if cond != nil {
				r, m = cond.Reason, cond.Message
			}
			if unhealthy == 0 {
				reason = r
			}
			unhealthy++
			entry := fmt.Sprintf("claim %s: %s: %s", c.Name, r, boundedMessage(m))
			if size+len(entry) <= maxGitSummary {
				bad = append(bad, entry)
				size += len(entry) + len("; ")
			}
		}
	}
	switch {
	case total == 0:
		return nil
	case unhealthy == 0:
		return &gitHealth{healthy: true, reason: v1alpha1.ReasonHealthy, message: fmt.Sprintf("%d worktree(s) healthy", total)}
	case len(bad) < unhealthy:
		return &gitHealth{reason: reason, message: fmt.Sprintf("%s; and %d more: %d of %d worktree(s) unhealthy",
			strings.Join(bad, "; "), unhealthy-len(bad), unhealthy, total)}
	default:
		return &gitHealth{reason: reason, message: strings.Join(bad, "; ")}
	}
}
