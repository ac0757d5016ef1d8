package worktree

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// secretConf is a git configuration file whose value stands for a host
// secret: git config --list prints it if git can read the file.
const secretConf = "[s]\n\tk = TOPSECRET-7f3a\n"

// jailedRepo is a mount owned by an unprivileged identity, with two files
// host git must not read: one outside the mount (world-readable, so only
// the jail keeps git from it) and one inside the mount readable by root
// only (so only the identity keeps git from it).
func jailedRepo(t *testing.T) (repo Repo, outside, rootOnly string) {
	t.Helper()
	testenv.Binary(t, "git", "install git (hack/install-deps.sh)")
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	base := t.TempDir()
	for d := base; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mount := filepath.Join(base, "mount")
	if err := os.Mkdir(mount, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mount, 61234, 61234); err != nil {
		t.Fatal(err)
	}
	// Not below /tmp: the jail has a /tmp of its own, which would hide it
	// whether or not the jail shows the rest of the host.
	hostDir, err := os.MkdirTemp("/var/tmp", "worktree-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	if err := os.Chmod(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	outside = filepath.Join(hostDir, "host-secret")
	rootOnly = filepath.Join(mount, "root-only")
	if err := os.WriteFile(outside, []byte(secretConf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootOnly, []byte(secretConf), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := areas.OpenRoot("mount", mount, false)
	if err != nil {
		t.Fatal(err)
	}
	return Repo{Mount: root, As: Identity{UID: 61234, GID: 61234}}, outside, rootOnly
}

func TestHostGitSeesNeitherHostFilesNorRootOnlyFiles(t *testing.T) {
	repo, outside, rootOnly := jailedRepo(t)
	// Without the jail or the identity, git prints the secret: the check
	// of the test itself.
	if out, err := exec.Command("git", "config", "--file", outside, "--list").Output(); err != nil || !strings.Contains(string(out), "TOPSECRET") {
		t.Fatalf("the test's secret is not readable by git outside the jail: %q %v", out, err)
	}
	for _, tc := range []struct{ name, file string }{
		{"a host file outside the mount (the jail)", outside},
		{"a root-only file inside the mount (the identity)", rootOnly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := hostGit(logr.NewContext(context.Background(), testr.New(t)), repo, repo.Mount.HostPath(), "config", "--file", tc.file, "--list")
			if err == nil || strings.Contains(out, "TOPSECRET") {
				t.Fatalf("host git read %s: %q, %v", tc.file, out, err)
			}
			if strings.Contains(err.Error(), "TOPSECRET") {
				t.Fatalf("the error carries the file's content: %v", err)
			}
		})
	}
}

func TestHostGitNeverRunsAsRoot(t *testing.T) {
	for _, id := range []Identity{{}, {UID: 0, GID: 5}, {UID: 5, GID: 0}} {
		if got := (Repo{As: id}).runAs(); got.UID == 0 || got.GID == 0 {
			t.Fatalf("identity %+v runs host git as %+v", id, got)
		}
	}
	repo, _, _ := jailedRepo(t)
	repo.As = Identity{}
	out, err := hostGit(logr.NewContext(context.Background(), testr.New(t)), repo, "/", "rev-parse", "--show-toplevel")
	_ = out
	var ge *Error
	if err == nil || !errors.As(err, &ge) {
		t.Fatalf("want a git error outside any repository, got %q %v", out, err)
	}
}

func TestCommandKey(t *testing.T) {
	for _, tc := range []struct {
		name, conf, want string
	}{
		{"plain repository", "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = x\n", ""},
		{"smudge filter", "[filter \"x\"]\n\tsmudge = cat /etc/shadow\n", "filter.<driver>.smudge"},
		{"clean filter, odd case and spacing", "[FiLtEr  \"x\"]\nCLEAN=cmd\n", "filter.<driver>.clean"},
		{"process filter, old subsection syntax", "[filter.x]\nprocess = cmd\n", "filter.<driver>.process"},
		{"key on the header's line", "[filter \"x\"] smudge = cmd\n", "filter.<driver>.smudge"},
		{"boolean-looking key with a comment", "[filter \"x\"]\n\tsmudge # cmd\n", "filter.<driver>.smudge"},
		{"byte order mark", "\xef\xbb\xbf[filter \"x\"]\nsmudge = cmd\n", "filter.<driver>.smudge"},
		{"diff driver", "[diff \"x\"]\n\tcommand = cmd\n", "diff.<driver>.command"},
		{"textconv", "[diff \"x\"]\n\ttextconv = cmd\n", "diff.<driver>.textconv"},
		{"external diff", "[diff]\n\texternal = cmd\n", "diff.<driver>.external"},
		{"merge driver", "[merge \"x\"]\n\tdriver = cmd\n", "merge.<driver>.driver"},
		{"include", "[include]\n\tpath = /root/.gitconfig\n", `"include" (a configuration include)`},
		{"includeIf", "[includeIf \"gitdir:/\"]\n\tpath = x\n", `"includeif" (a configuration include)`},
		{"filter name without a command", "[filter \"lfs\"]\n\trequired = true\n", ""},
		{"smudge outside a filter section", "[core]\n\tsmudge = x\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commandKey([]byte(tc.conf)); got != tc.want {
				t.Fatalf("commandKey = %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzCommandKey holds the configuration check to git's own reading: any
// configuration in which git finds a filter, diff or merge command or an
// include, the check must refuse. The seeds run as a normal test.
func FuzzCommandKey(f *testing.F) {
	testenv.Binary(f, "git", "install git (hack/install-deps.sh)")
	for _, s := range []string{
		"[filter \"x\"]\n\tsmudge = c\n", "[filter \"x\"] clean = c\n", "[filter.x]\nprocess=c\n",
		"[diff \"x\"]\ncommand=c\n", "[merge \"x\"]\ndriver=c\n", "[include]\npath=/x\n",
		"[core]\nbare=false\n", "[a]\nb = \"x\\\n[filter \\\"y\\\"]\"\nsmudge=c\n", "[filter \"x\"]\n\tsmudge\n",
		"[filter \"a]b\"]\nsmudge=c\n", "[filter \"x\"]\nsmudge=c ; comment\n",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, conf string) {
		file := filepath.Join(dir, "config")
		if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("git", "config", "--file", file, "--name-only", "--get-regexp",
			`^(filter\..*\.(smudge|clean|process)|diff\..*\.(command|textconv)|diff\.external|merge\..*\.driver|include\.path|includeif\..*\.path)$`)
		cmd.Env = []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=/nonexistent"}
		out, _ := cmd.Output()
		if strings.TrimSpace(string(out)) != "" && commandKey([]byte(conf)) == "" {
			t.Fatalf("git finds %q in the configuration, the check finds nothing:\n%s", out, conf)
		}
	})
}

// Host git's jail starts with, of the host's mounts, only those it binds
// and runs from: not the host's other mounts (a busy node's pods and
// containers, the instances' trees, network namespaces and overlays),
// which bubblewrap would copy and read again for every bind. What it
// starts with is recorded by a bubblewrap that writes its mount table
// first.
func TestHostGitStartsWithoutTheHostsOtherMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "the jail's start namespace is made only as root: run the tests as root (CI does)")
	}
	repo, _, _ := jailedRepo(t)
	dir := testenv.SharedDir(t)
	_, table := testenv.TellingBwrap(t, dir)
	// hostGit runs the bubblewrap found first on PATH.
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	crowd := testenv.Crowd(t, filepath.Join(t.TempDir(), "crowd"), 20)
	if _, err := hostGit(logr.NewContext(context.Background(), testr.New(t)), repo, repo.Mount.HostPath(), "version"); err != nil {
		t.Fatalf("host git: %v", err)
	}
	b, err := os.ReadFile(table)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		t.Fatal("the jail's bubblewrap wrote no mount table")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], crowd+"/") {
			t.Errorf("host git's jail started with the host's mount %s", f[4])
		}
	}
}

// The agent swaps its mount's path for a link to another directory it
// can reach on the host, after the controller opened and checked the
// mount. Host git's jail binds the directory the controller holds, never
// what the path leads to now.
func TestHostGitBindsTheMountItHolds(t *testing.T) {
	repo, _, _ := jailedRepo(t)
	mount := repo.Mount.HostPath()
	other := filepath.Join(filepath.Dir(mount), "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "marker.conf"), []byte("[s]\n\tk = TOPSECRET-other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(mount, mount+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, mount); err != nil {
		t.Fatal(err)
	}
	out, err := hostGit(logr.NewContext(context.Background(), testr.New(t)), repo, mount, "config", "--file", filepath.Join(mount, "marker.conf"), "--list")
	if err == nil || strings.Contains(out, "TOPSECRET") {
		t.Fatalf("host git worked in the directory a link swapped in for the mount: %q, %v", out, err)
	}
}
