package worktree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
	"github.com/cireilclaw/sandbox-controller/internal/fdfile"
	"github.com/cireilclaw/sandbox-controller/internal/startns"
)

// Identity is a host user and group that host git runs as.
type Identity struct {
	UID, GID uint32
}

// FallbackIdentity is who host git runs as when the caller knows no
// identity for the agent (nobody/nogroup): never root.
var FallbackIdentity = Identity{UID: 65534, GID: 65534}

// runAs is the identity host git runs as for repo: the agent's, or the
// fallback when it is unset or root.
func (r Repo) runAs() Identity {
	if r.As.UID == 0 || r.As.GID == 0 {
		return FallbackIdentity
	}
	return r.As
}

// DefaultGitTimeout bounds each host git call when Repo.GitTimeout is zero.
// Adding a worktree without a checkout takes well under a second; a call
// that needs longer is stuck on something the agent planted (a FIFO, a
// huge file) and must let the reconcile go.
const DefaultGitTimeout = 30 * time.Second

func (r Repo) gitTimeout() time.Duration {
	if r.GitTimeout > 0 {
		return r.GitTimeout
	}
	return DefaultGitTimeout
}

// Limits of what host git's output the controller keeps. Its stdout is a
// commit id or a branch name; its stderr goes to the log, never to status.
const (
	maxGitStdout = 4 << 10
	maxGitStderr = 4 << 10
)

// systemDirs are what git itself needs from the host: its binary and
// libraries. On a merged-/usr host the others are links into /usr, and are
// made links in the jail too.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// gitConfig overrides whatever the repository's configuration says about
// running code or reaching out: no hooks, no fsmonitor daemon, no
// attributes file of the user's, no transport at all (a partial clone's
// lazy fetch would run the repository's core.sshCommand), no automatic gc.
var gitConfig = []string{
	"core.hooksPath=/dev/null",
	"core.fsmonitor=false",
	"core.attributesFile=/dev/null",
	"protocol.allow=never",
	"gc.auto=0",
	"maintenance.auto=false",
	"safe.directory=*",
}

// gitEnv is host git's whole environment: no system or global
// configuration, no system attributes, no prompts or pagers, and a fixed
// committer for the reflog entries worktree add -b writes.
var gitEnv = []string{
	"GIT_CONFIG_NOSYSTEM=1",
	"GIT_CONFIG_GLOBAL=/dev/null",
	"GIT_ATTR_NOSYSTEM=1",
	"GIT_NO_REPLACE_OBJECTS=1",
	"GIT_NO_LAZY_FETCH=1",
	"GIT_PROTOCOL_FROM_USER=0",
	"GIT_TERMINAL_PROMPT=0",
	"GIT_PAGER=cat",
	"GIT_COMMITTER_NAME=sandbox-controller",
	"GIT_COMMITTER_EMAIL=sandbox-controller@localhost",
	"GIT_AUTHOR_NAME=sandbox-controller",
	"GIT_AUTHOR_EMAIL=sandbox-controller@localhost",
	"HOME=/nonexistent",
	"XDG_CONFIG_HOME=/nonexistent",
	"PATH=/usr/local/bin:/usr/bin:/bin",
	"LC_ALL=C",
	// git allocates an object's size as its header declares it before it
	// checks anything: a loose commit of a megabyte on disk that declares
	// a gigabyte made host git, which no Sandbox's limits bind, hold a
	// gigabyte every health check. Host git reads refs, commits and tags
	// (a worktree is added without a checkout), never a large object.
	"GIT_ALLOC_LIMIT=" + strconv.Itoa(maxGitAlloc),
}

// maxGitAlloc bounds each allocation of host git (GIT_ALLOC_LIMIT).
const maxGitAlloc = 64 << 20

// jailArgs are bwrap's arguments for a git that sees the host's system
// directories read-only and the repository's mount read-write, nothing else
// of the host: no /etc, no /home, no /root, no other agent's areas. The
// mount is bound from mountFD, the directory the controller holds and
// checked: bubblewrap makes sure what it mounted is that directory, so a
// link the agent swapped in for the mount's path since is never followed.
func jailArgs(mount string, mountFD int) []string {
	args := []string{"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				args = append(args, "--symlink", target, d)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	// The dynamic loader finds multiarch libraries through its cache.
	args = append(args, "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
		"--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
		"--bind-fd", strconv.Itoa(mountFD), mount)
	return args
}

// jails makes the mount namespaces host git's jails start in: of the
// host's mounts, those the jail binds and runs from (internal/startns).
var jails = startns.New("")

// hostGit runs git for the controller on the repository: inside a
// bubblewrap jail (jailArgs), as the agent's identity (never root), with
// the repository's means of running code switched off (gitConfig, gitEnv),
// arguments after --end-of-options where the caller puts them, and a
// deadline. Its stderr goes to the controller log, bounded; the error says
// in the product's words what failed.
func hostGit(ctx context.Context, repo Repo, dir string, args ...string) (string, error) {
	verb := args[0]
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return "", &Error{Reason: ReasonGitFailed, Message: fmt.Sprintf("cannot run git %s: the controller runs git in a bubblewrap jail and bwrap is not installed (install the bubblewrap package)", verb)}
	}
	timeout := repo.gitTimeout()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// The mount's directory as the controller holds it (reopened and
	// checked against the one it opened), for the jail's bind.
	mountDir, err := repo.Mount.OpenDir("")
	if err != nil {
		return "", &Error{Reason: ReasonGitFailed, Message: fmt.Sprintf("cannot run git %s: opening the repository's mount: %v", verb, err)}
	}
	defer mountDir.Close()
	full := append(jailArgs(repo.Mount.HostPath(), 3), "--", "git")
	for _, c := range gitConfig {
		full = append(full, "-c", c)
	}
	full = append(full, "-C", dir)
	full = append(full, args...)
	if err := fdfile.CloseInheritedOnExec(); err != nil {
		return "", &Error{Reason: ReasonGitFailed, Message: fmt.Sprintf("cannot run git %s: keeping this process's inherited descriptors from it: %v", verb, err)}
	}
	cmd := exec.CommandContext(ctx, bwrap, full...)
	cmd.ExtraFiles = []*os.File{mountDir} // descriptor 3
	cmd.Env = gitEnv
	id := repo.runAs()
	if uint32(os.Geteuid()) != id.UID {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: []uint32{}}}
	}
	// --die-with-parent ends git with bwrap; WaitDelay stops waiting for
	// pipes a stray child might still hold.
	cmd.WaitDelay = 2 * time.Second
	out, errb := boundedbuf.New(maxGitStdout), boundedbuf.New(maxGitStderr)
	cmd.Stdout, cmd.Stderr = out, errb
	// Started where of the host's mounts only those the jail needs are:
	// bubblewrap copies the namespace it starts in, and reads its mount
	// table for every bind.
	err = jails.RunWith(nil, startns.ForBubblewrap(full, cmd.ExtraFiles, bwrap), nil, cmd.Run)
	if errors.Is(err, startns.ErrUnavailable) {
		err = cmd.Run()
	}
	if err == nil && out.Truncated() {
		err = errors.New("output too long")
	}
	if err != nil {
		logr.FromContextOrDiscard(ctx).Info("host git failed", "dir", dir, "args", args,
			"uid", id.UID, "error", err.Error(), "stderr", errb.String())
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "", &Error{Reason: ReasonGitTimedOut, Message: fmt.Sprintf("git %s in %s did not finish within %s and was stopped; something in the repository's git directory blocks it (a FIFO or a huge file)", verb, dir, timeout)}
		}
		if jailFailed(errb.String()) {
			// bwrap's own message names a host path; it goes to the log.
			return "", &Error{Reason: ReasonGitJailFailed, Message: fmt.Sprintf("git %s could not start: the bubblewrap jail host git runs in failed to set up, so git never ran; "+
				"most often the agent's id %d cannot reach %s (every parent directory must let it through); the controller log has bubblewrap's message", verb, id.UID, repo.Mount.HostPath())}
		}
		return "", &Error{Reason: ReasonGitFailed, Message: fmt.Sprintf("git %s in %s failed (%v); the controller log has git's output", verb, dir, err)}
	}
	return strings.TrimSpace(out.String()), nil
}

// jailFailed says whether bubblewrap, not git, failed: bwrap reports its
// own setup errors prefixed with its name, which git never prints (git's
// own messages begin fatal:, error: or usage:).
func jailFailed(stderr string) bool {
	return strings.HasPrefix(stderr, "bwrap: ")
}
