package worktree_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/stdr"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/worktree"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// ctx logs what the controller would log (host git's stderr) to stderr.
var ctx = logr.NewContext(context.Background(), stdr.New(log.New(os.Stderr, "", 0)))

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*", "-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// agent is the host identity the tests' repositories belong to and host
// git runs as: not root, and not the fallback, so a test sees the identity
// passed in is the one used.
var agent = worktree.Identity{UID: 61234, GID: 61234}

// newRepo makes a mount holding a repository with one commit on main,
// owned by agent, as an agent's mount is.
func newRepo(t *testing.T) worktree.Repo {
	t.Helper()
	testenv.Binary(t, "git", "install git (hack/install-deps.sh)")
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	mount := t.TempDir()
	// The agent's identity must reach its mount, as on a real host.
	for d := mount; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	repo := filepath.Join(mount, "app")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, repo, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, repo, "add", "README")
	git(t, repo, "commit", "-q", "-m", "first")
	chownTree(t, mount, agent)
	root, err := areas.OpenRoot("/workspace/project", mount, false)
	if err != nil {
		t.Fatal(err)
	}
	return worktree.Repo{Mount: root, Rel: "app", As: agent}
}

func chownTree(t *testing.T, dir string, id worktree.Identity) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(id.UID), int(id.GID))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAddCreatesBranchWithoutCheckingOutAndIsIdempotent(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "s1", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	if wt.Branch != "s1" || wt.Head != git(t, repo.HostPath(), "rev-parse", "main") {
		t.Fatalf("got branch %q head %q", wt.Branch, wt.Head)
	}
	if _, err := os.Stat(filepath.Join(wt.HostPath, "README")); !os.IsNotExist(err) {
		t.Fatalf("files were checked out on the host; the checkout belongs inside the sandbox (%v)", err)
	}
	if got := git(t, repo.HostPath(), "status", "--porcelain"); got != "" {
		t.Fatalf("the main working tree shows the worktrees directory: %q", got)
	}
	again, err := worktree.Add(ctx, repo, worktree.Spec{Name: "s1", CreateBranch: true})
	if err != nil || again.HostPath != wt.HostPath || again.Head != wt.Head {
		t.Fatalf("second Add: %+v, %v", again, err)
	}
	if h := worktree.Check(ctx, repo, wt); h.Reason != worktree.ReasonHealthy {
		t.Fatalf("health: %+v", h)
	}
}

func TestAddDetachedAtRef(t *testing.T) {
	repo := newRepo(t)
	head := git(t, repo.HostPath(), "rev-parse", "HEAD")
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "d", Ref: head})
	if err != nil {
		t.Fatal(err)
	}
	if wt.Branch != "" || wt.Head != head {
		t.Fatalf("want detached at %s, got branch %q head %q", head, wt.Branch, wt.Head)
	}
}

func TestAddRunsNoHookOfTheRepository(t *testing.T) {
	repo := newRepo(t)
	marker := filepath.Join(t.TempDir(), "hook-ran")
	hook := filepath.Join(repo.GitCommonDir(), "hooks", "post-checkout")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := worktree.Add(ctx, repo, worktree.Spec{Name: "h", CreateBranch: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a hook of the repository ran on the host")
	}
}

func TestHostGitCannotWriteOutsideTheMount(t *testing.T) {
	repo := newRepo(t)
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	outside := t.TempDir()
	// An agent replaces the repository's worktrees directory with a link
	// out of the mount before the controller adds a worktree.
	if err := os.Symlink(outside, filepath.Join(repo.GitCommonDir(), "worktrees")); err != nil {
		t.Fatal(err)
	}
	_, err := worktree.Add(ctx, repo, worktree.Spec{Name: "x", CreateBranch: true})
	if err == nil {
		t.Fatalf("adding a worktree through a link out of the mount succeeded")
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 0 {
		t.Fatalf("host git wrote outside the mount: %v", entries)
	}
}

func TestCheckReasons(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, repo worktree.Repo, wt worktree.Worktree)
		reason  string
	}{
		{"Healthy", func(*testing.T, worktree.Repo, worktree.Worktree) {}, worktree.ReasonHealthy},
		{"GitdirMissing", func(t *testing.T, repo worktree.Repo, wt worktree.Worktree) {
			if err := os.RemoveAll(filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name)); err != nil {
				t.Fatal(err)
			}
		}, worktree.ReasonGitdirMissing},
		{"GitdirMismatch", func(t *testing.T, repo worktree.Repo, wt worktree.Worktree) {
			back := filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name, "gitdir")
			if err := os.WriteFile(back, []byte("/elsewhere/.git\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, worktree.ReasonGitdirMismatch},
		{"WorktreeLocked", func(t *testing.T, repo worktree.Repo, wt worktree.Worktree) {
			git(t, repo.HostPath(), "worktree", "lock", "--reason", "on a laptop", wt.HostPath)
		}, worktree.ReasonWorktreeLocked},
		{"WorktreePrunable", func(t *testing.T, repo worktree.Repo, wt worktree.Worktree) {
			if err := os.RemoveAll(wt.HostPath); err != nil {
				t.Fatal(err)
			}
		}, worktree.ReasonWorktreePrunable},
		{"HeadUnresolvable", func(t *testing.T, repo worktree.Repo, wt worktree.Worktree) {
			head := filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name, "HEAD")
			if err := os.WriteFile(head, []byte("ref: refs/heads/no-such-branch\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, worktree.ReasonHeadUnresolvable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "w", CreateBranch: true})
			if err != nil {
				t.Fatal(err)
			}
			tc.breakIt(t, repo, wt)
			if h := worktree.Check(ctx, repo, wt); h.Reason != tc.reason {
				t.Fatalf("want %s, got %s: %s", tc.reason, h.Reason, h.Message)
			}
		})
	}
}

func TestRemoveKeepsDirtyAndRemovesCleanButNeverTheBranch(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "r", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(wt.HostPath, "link-out")); err != nil {
		t.Fatal(err)
	}
	if err := worktree.Remove(repo, wt, true); !errors.Is(err, worktree.ErrDirty) {
		t.Fatalf("dirty: want ErrDirty, got %v", err)
	}
	if _, err := os.Stat(wt.HostPath); err != nil {
		t.Fatalf("dirty worktree was not kept: %v", err)
	}
	if err := worktree.Remove(repo, wt, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(wt.HostPath); !os.IsNotExist(err) {
		t.Fatalf("clean worktree still there: %v", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("removal followed a symbolic link out of the mount: %v", err)
	}
	if got := git(t, repo.HostPath(), "worktree", "list", "--porcelain"); strings.Contains(got, wt.HostPath) {
		t.Fatalf("git still lists the removed worktree:\n%s", got)
	}
	git(t, repo.HostPath(), "rev-parse", "--verify", "refs/heads/r")
}

func TestUntouchedTellsAnEmptyWorktreeFromOneWithFiles(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "u", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	if wt.HostPath != worktree.For(repo, "u").HostPath {
		t.Fatalf("For and Add disagree on where the worktree lives: %s vs %s", worktree.For(repo, "u").HostPath, wt.HostPath)
	}
	if ok, err := worktree.Untouched(repo, wt); err != nil || !ok {
		t.Fatalf("a fresh worktree without checkout: Untouched = %v, %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(wt.HostPath, "draft.txt"), []byte("work"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := worktree.Untouched(repo, wt); err != nil || ok {
		t.Fatalf("a worktree holding a file: Untouched = %v, %v", ok, err)
	}
}

// relativize rewrites a worktree's links the way git 2.48 and later write
// them with --relative-paths: the .git file relative to the worktree, the
// back-pointer relative to the administrative directory.
func relativize(t *testing.T, repo worktree.Repo, wt worktree.Worktree) {
	t.Helper()
	admin := filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name)
	toAdmin, err := filepath.Rel(wt.HostPath, admin)
	if err != nil {
		t.Fatal(err)
	}
	toWorktree, err := filepath.Rel(admin, filepath.Join(wt.HostPath, ".git"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wt.HostPath, ".git"), []byte("gitdir: "+toAdmin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(admin, "gitdir"), []byte(toWorktree+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRelativeLinksAreRecognisedAndHoldWhereverTheMountIs(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "rel", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	if wt.Relative {
		t.Fatal("a worktree git added with absolute links reads as relative")
	}
	relativize(t, repo, wt)
	again, err := worktree.Add(ctx, repo, worktree.Spec{Name: "rel", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Relative || again.Head != wt.Head {
		t.Fatalf("the existing relative worktree: %+v", again)
	}
	if h := worktree.Check(ctx, repo, again); h.Reason != worktree.ReasonHealthy {
		t.Fatalf("health of a relative worktree: %+v", h)
	}

	// The mount seen at another path, as inside a sandbox: nothing names
	// the old absolute path, so git and the check still work there.
	moved := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Rename(repo.Mount.HostPath(), moved); err != nil {
		t.Fatal(err)
	}
	root, err := areas.OpenRoot("/workspace/project", moved, false)
	if err != nil {
		t.Fatal(err)
	}
	there := worktree.Repo{Mount: root, Rel: repo.Rel}
	wtThere := worktree.For(there, "rel")
	git(t, wtThere.HostPath, "checkout", "-q", "rel", "--", ".")
	if got := git(t, wtThere.HostPath, "rev-parse", "--abbrev-ref", "HEAD"); got != "rel" {
		t.Fatalf("HEAD of the moved worktree: %q", got)
	}
	if h := worktree.Check(ctx, there, wtThere); h.Reason != worktree.ReasonHealthy {
		t.Fatalf("health of the moved relative worktree: %+v", h)
	}
}

// A mount the agent's id cannot reach stops the jail before git runs; the
// claim must say that, not that the ref names no commit.
func TestAnUnreachableMountIsReportedAsSuch(t *testing.T) {
	repo := newRepo(t)
	// The mount's parent lets only root through.
	parent := filepath.Dir(repo.Mount.HostPath())
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(parent, 0o755) })
	_, err := worktree.Add(context.Background(), repo, worktree.Spec{Name: "s1", Ref: "main"})
	if got := worktree.ReasonOf(err); got != worktree.ReasonGitJailFailed {
		t.Fatalf("reason %q (%v), want %s", got, err, worktree.ReasonGitJailFailed)
	}
	if !strings.Contains(err.Error(), "cannot reach "+repo.Mount.HostPath()) {
		t.Errorf("message %q does not say which directory", err)
	}
}
