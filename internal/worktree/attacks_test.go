package worktree_test

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1" //nolint:gosec // git's object ids
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/cireilclaw/sandbox-controller/internal/worktree"
)

// hostSecret is a root-only host file outside every mount, as /etc/shadow.
func hostSecret(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	secret := filepath.Join(dir, "shadow")
	if err := os.WriteFile(secret, []byte("root:TOPSECRET-91c2:19000::::::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secret
}

// assertNoSecret fails when the secret's content shows in err or in any
// file of the mount.
func assertNoSecret(t *testing.T, repo worktree.Repo, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "TOPSECRET") {
		t.Fatalf("the error carries the host file: %v", err)
	}
	werr := filepath.WalkDir(repo.Mount.HostPath(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "TOPSECRET") {
			t.Errorf("%s holds the host file's content", p)
		}
		return nil
	})
	if werr != nil {
		t.Fatal(werr)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The attack of issue 13: worktree.ref "--checkout" overrode --no-checkout
// and the repository's smudge filter, planted by the agent, copied a
// root-only host file into the mount; an alternates link had host git echo
// a host file into status.
func TestAttackOptionInjectionSmudgeFilterAndAlternatesLink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spec   worktree.Spec
		plant  func(t *testing.T, repo worktree.Repo, secret string)
		reason string
	}{
		{"ref --checkout is refused before git runs", worktree.Spec{Name: "s1", Ref: "--checkout"},
			func(*testing.T, worktree.Repo, string) {}, worktree.ReasonInvalidSpec},
		{"smudge filter in .git/config and info/attributes", worktree.Spec{Name: "s1", CreateBranch: true},
			func(t *testing.T, repo worktree.Repo, secret string) {
				write(t, filepath.Join(repo.GitCommonDir(), "config"), "[core]\n\trepositoryformatversion = 0\n[filter \"leak\"]\n\tsmudge = cat "+secret+"\n")
				write(t, filepath.Join(repo.GitCommonDir(), "info", "attributes"), "* filter=leak\n")
			}, worktree.ReasonUnsafeRepository},
		{"alternates linked to a root-only host file", worktree.Spec{Name: "s1", CreateBranch: true},
			func(t *testing.T, repo worktree.Repo, secret string) {
				if err := os.Symlink(secret, filepath.Join(repo.GitCommonDir(), "objects", "info", "alternates")); err != nil {
					t.Fatal(err)
				}
			}, worktree.ReasonUnsafeRepository},
		{"packed-refs linked to a root-only host file", worktree.Spec{Name: "s1", Ref: "main"},
			func(t *testing.T, repo worktree.Repo, secret string) {
				if err := os.Symlink(secret, filepath.Join(repo.GitCommonDir(), "packed-refs")); err != nil {
					t.Fatal(err)
				}
			}, worktree.ReasonUnsafeRepository},
		{"config includes a host file", worktree.Spec{Name: "s1", CreateBranch: true},
			func(t *testing.T, repo worktree.Repo, secret string) {
				write(t, filepath.Join(repo.GitCommonDir(), "config"), "[include]\n\tpath = "+secret+"\n")
			}, worktree.ReasonUnsafeRepository},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			secret := hostSecret(t)
			tc.plant(t, repo, secret)
			_, err := worktree.Add(ctx, repo, tc.spec)
			if err == nil {
				t.Fatal("Add succeeded")
			}
			if got := worktree.ReasonOf(err); got != tc.reason {
				t.Fatalf("reason %q (%v), want %q", got, err, tc.reason)
			}
			if _, serr := os.Stat(filepath.Join(repo.HostPath(), worktree.Dir, "s1", "README")); serr == nil {
				t.Fatal("files were checked out on the host")
			}
			assertNoSecret(t, repo, err)
		})
	}
}

// A link planted after the worktree was added is refused by the next
// health check, which says so without reading it. (Were it swapped in
// between a check and git's read, TestHostGitSeesNeitherHostFilesNorRootOnlyFiles
// shows what holds then: the jail and the identity.)
func TestAlternatesLinkPlantedLaterIsRefusedByTheHealthCheck(t *testing.T) {
	repo := newRepo(t)
	secret := hostSecret(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "s1", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	alt := filepath.Join(repo.GitCommonDir(), "objects", "info", "alternates")
	if err := os.Symlink(secret, alt); err != nil {
		t.Fatal(err)
	}
	h := worktree.Check(ctx, repo, wt)
	if h.Reason != worktree.ReasonUnsafeRepository || strings.Contains(h.Message, "TOPSECRET") {
		t.Fatalf("health: %+v", h)
	}
	assertNoSecret(t, repo, nil)
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	_ = os.Remove(path)
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A FIFO where host git reads would block it forever.
func TestFIFOsInTheGitDirectoryAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		where func(repo worktree.Repo, wt worktree.Worktree) string
	}{
		{"worktrees/<name>/HEAD", func(repo worktree.Repo, wt worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name, "HEAD")
		}},
		{"worktrees/<name>/commondir", func(repo worktree.Repo, wt worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name, "commondir")
		}},
		{"HEAD", func(repo worktree.Repo, _ worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "HEAD")
		}},
		{"config", func(repo worktree.Repo, _ worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "config")
		}},
		{"the worktree's .git file", func(_ worktree.Repo, wt worktree.Worktree) string { return filepath.Join(wt.HostPath, ".git") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "f", CreateBranch: true})
			if err != nil {
				t.Fatal(err)
			}
			mkfifo(t, tc.where(repo, wt))
			if h := worktree.Check(ctx, repo, wt); h.Reason == worktree.ReasonHealthy || h.Reason == worktree.ReasonGitTimedOut {
				t.Fatalf("health: %+v", h)
			}
			if _, err := worktree.Add(ctx, repo, worktree.Spec{Name: "f", CreateBranch: true}); err == nil {
				t.Fatal("Add over a FIFO succeeded")
			}
		})
	}
}

// A FIFO the checks do not look for (a loose ref) still cannot hold the
// caller: host git is stopped at its deadline and the reason says so.
func TestHostGitIsStoppedAtItsDeadline(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "d", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	// The short deadline only for the call the FIFO blocks: on a loaded
	// machine the Add above may take longer than a second.
	repo.GitTimeout = time.Second
	mkfifo(t, filepath.Join(repo.GitCommonDir(), "refs", "heads", "d"))
	if h := worktree.Check(ctx, repo, wt); h.Reason != worktree.ReasonGitTimedOut {
		t.Fatalf("health: %+v", h)
	}
}

// sparse makes path a sparse file of size bytes.
func sparse(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// allocated is how many bytes the program allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A 1 GiB sparse file where the controller reads once cost it about 5 GiB
// a health check.
func TestOversizedGitFilesAreRefusedWithinTheirLimit(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name  string
		where func(repo worktree.Repo, wt worktree.Worktree) string
		check func(repo worktree.Repo, wt worktree.Worktree) string
	}{
		{"the worktree's .git file", func(_ worktree.Repo, wt worktree.Worktree) string { return filepath.Join(wt.HostPath, ".git") },
			func(repo worktree.Repo, wt worktree.Worktree) string { return worktree.Check(ctx, repo, wt).Message }},
		{"worktrees/<name>/gitdir", func(repo worktree.Repo, wt worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name, "gitdir")
		}, func(repo worktree.Repo, wt worktree.Worktree) string { return worktree.Check(ctx, repo, wt).Message }},
		{"worktrees/<name>/locked", func(repo worktree.Repo, wt worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name, "locked")
		}, func(repo worktree.Repo, wt worktree.Worktree) string { return worktree.Check(ctx, repo, wt).Message }},
		{".git/config", func(repo worktree.Repo, _ worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "config")
		},
			func(repo worktree.Repo, _ worktree.Worktree) string {
				_, err := worktree.Add(ctx, repo, worktree.Spec{Name: "other", CreateBranch: true})
				if err == nil {
					return ""
				}
				return err.Error()
			}},
		{".git/info/exclude", func(repo worktree.Repo, _ worktree.Worktree) string {
			return filepath.Join(repo.GitCommonDir(), "info", "exclude")
		}, func(repo worktree.Repo, _ worktree.Worktree) string {
			_, err := worktree.Add(ctx, repo, worktree.Spec{Name: "other", CreateBranch: true})
			if err == nil {
				return ""
			}
			return err.Error()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "big", CreateBranch: true})
			if err != nil {
				t.Fatal(err)
			}
			sparse(t, tc.where(repo, wt), gib)
			var msg string
			n := allocated(func() { msg = tc.check(repo, wt) })
			if !strings.Contains(msg, "larger than the controller reads") {
				t.Fatalf("want a clear size error, got %q", msg)
			}
			if n > 4<<20 {
				t.Fatalf("reading a 1 GiB file allocated %d bytes; the limit is %d", n, worktree.MaxConfigSize)
			}
		})
	}
}

// How many names a directory holds is the agent's to choose; the checks
// read a bounded number of them, as root, every health interval.
func TestCrowdedGitDirectoriesAreRefusedWithinTheirBound(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "crowd", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	admin := filepath.Join(repo.GitCommonDir(), "worktrees", wt.Name)
	for i := range 300 {
		if err := os.WriteFile(filepath.Join(admin, fmt.Sprintf("filler-%d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := worktree.Check(ctx, repo, wt)
	if h.Reason != worktree.ReasonUnsafeRepository || !strings.Contains(h.Message, "more than") {
		t.Fatalf("a worktree's administrative directory of 300 entries: %+v; want it refused past the bound", h)
	}
	if _, err := worktree.Add(ctx, repo, worktree.Spec{Name: "other", CreateBranch: true}); err == nil {
		t.Fatal("Add in a repository with a crowded administrative directory succeeded")
	}
}

// A loose commit whose header declares far more than the object holds:
// host git allocated what it declared (a gigabyte, from a megabyte on
// disk) before it found the object bogus, every health check, outside
// any Sandbox's limits.
func TestHostGitRefusesAnObjectThatDeclaresAHugeSize(t *testing.T) {
	repo := newRepo(t)
	wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "bomb", CreateBranch: true})
	if err != nil {
		t.Fatal(err)
	}
	// "commit <size>\0" and size zero bytes, as git stores a loose object.
	const size = 256 << 20
	header := fmt.Sprintf("commit %d\x00", size)
	sum := sha1.New()
	var packed bytes.Buffer
	z, err := zlib.NewWriterLevel(&packed, zlib.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	w := io.MultiWriter(sum, z)
	if _, err := io.WriteString(w, header); err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	for range size >> 20 {
		if _, err := w.Write(zeros); err != nil {
			t.Fatal(err)
		}
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(sum.Sum(nil))
	objects := filepath.Join(repo.GitCommonDir(), "objects", id[:2])
	write(t, filepath.Join(objects, id[2:]), packed.String())
	write(t, filepath.Join(repo.GitCommonDir(), "refs", "heads", "bomb"), id+"\n")

	// What host git said goes to the controller's log.
	var logged strings.Builder
	var mu sync.Mutex
	logCtx := logr.NewContext(ctx, funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged.WriteString(args + "\n")
	}, funcr.Options{}))
	if h := worktree.Check(logCtx, repo, wt); h.Reason != worktree.ReasonHeadUnresolvable {
		t.Fatalf("health: %+v", h)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "over limit") {
		t.Fatalf("host git allocated the %d bytes the object declares; its log:\n%s", size, logged.String())
	}
}

// The agent names the entries of its git directory; a name with a line
// break or a terminal escape must not reach a status message as it is.
func TestEntryNamesTheAgentPlantsAreQuotedInMessages(t *testing.T) {
	const forged = "x\nGitHealthy True: \x1b[32mall worktrees healthy"
	link := func(t *testing.T, p string) {
		t.Helper()
		if err := os.Symlink("/etc/hostname", p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, admins string)
	}{
		{"a link in worktrees/", func(t *testing.T, admins string) {
			link(t, filepath.Join(admins, forged))
		}},
		{"a link in worktrees/<name>/", func(t *testing.T, admins string) {
			link(t, filepath.Join(admins, "q", forged))
		}},
		{"a link in a directory of worktrees/ so named", func(t *testing.T, admins string) {
			if err := os.Mkdir(filepath.Join(admins, forged), 0o755); err != nil {
				t.Fatal(err)
			}
			link(t, filepath.Join(admins, forged, "HEAD"))
		}},
		{"a filter in a directory of worktrees/ so named", func(t *testing.T, admins string) {
			write(t, filepath.Join(admins, forged, "config.worktree"), "[filter \"x\"]\n\tsmudge = cat\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			wt, err := worktree.Add(ctx, repo, worktree.Spec{Name: "q", CreateBranch: true})
			if err != nil {
				t.Fatal(err)
			}
			tc.plant(t, filepath.Join(repo.GitCommonDir(), "worktrees"))
			h := worktree.Check(ctx, repo, wt)
			if h.Reason != worktree.ReasonUnsafeRepository {
				t.Fatalf("health: %+v", h)
			}
			if strings.ContainsAny(h.Message, "\n\x1b") {
				t.Fatalf("the message carries the agent's name as it is: %q", h.Message)
			}
			_, err = worktree.Add(ctx, repo, worktree.Spec{Name: "q2", CreateBranch: true})
			if err == nil || strings.ContainsAny(err.Error(), "\n\x1b") {
				t.Fatalf("Add: %q", err)
			}
		})
	}
}
