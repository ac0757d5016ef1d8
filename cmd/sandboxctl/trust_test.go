package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// otherUser is the uid of the user who is neither root nor the caller.
const otherUser = 65534

// overlayMounted says whether an overlay file system is mounted at dir.
func overlayMounted(t *testing.T, dir string) bool {
	t.Helper()
	var st, parent unix.Stat_t
	var sfs unix.Statfs_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil || unix.Statfs(dir, &sfs) != nil {
		return false
	}
	return st.Dev != parent.Dev && sfs.Type == unix.OVERLAYFS_SUPER_MAGIC
}

func mkdirOwned(t *testing.T, dir string, mode os.FileMode, uid int) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A state directory, areas root or configuration that a user other than
// root and the caller can change is refused before anything is read from
// it or written to it. sandboxctl, as root, took the instance records of
// another user's state directory for its own and acted on what they name:
// a record planted there named a mount of the host as one of the agent's
// overlays, and the next run unmounted it.
func TestWhatAnotherUserCanChangeIsRefused(t *testing.T) {
	needBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "another user's directories are made with chown: run the tests as root (CI does)")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A mount of the host's that no sandbox has anything to do with.
	victim := filepath.Join(dir, "victim")
	for _, d := range []string{"lower", "upper", "work", "victim"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + filepath.Join(dir, "lower") + ",upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
	if err := unix.Mount("overlay", victim, "overlay", 0, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(victim, unix.MNT_DETACH) })

	cfg := writeConfig(t, mkdirOwned(t, filepath.Join(dir, "cfg"), 0o755, 0), "[bwrap]\nbinaries = [\"true\"]\n")
	run := func(t *testing.T, cfg, areas string, extra ...string) (int, string) {
		t.Helper()
		args := append([]string{"run", "--config", cfg, "--agent", "eve", "--areas-root", areas}, extra...)
		code, _, stderr := sandboxctl(t, "", append(args, "--", "true")...)
		return code, stderr
	}

	t.Run("another user's areas root, with a record naming a host mount", func(t *testing.T) {
		theirs := mkdirOwned(t, filepath.Join(dir, "theirs"), 0o755, otherUser)
		state := mkdirOwned(t, filepath.Join(theirs, ".sandboxctl"), 0o755, otherUser)
		rec, err := json.Marshal(map[string]any{
			"owner": "sandboxctl/eve", "running": true,
			"instance": map[string]any{"name": "cireilclaw-eve", "agent": "eve", "owner": "sandboxctl/eve",
				"mounts": []any{map[string]any{"source": filepath.Join(dir, "lower"), "target": "/workspace/x",
					"overlay": map[string]any{"lower": filepath.Join(dir, "lower"), "upper": filepath.Join(dir, "upper"),
						"work": filepath.Join(dir, "work"), "merged": victim}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(state, "cireilclaw-eve.json")
		if err := os.WriteFile(p, rec, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, otherUser, otherUser); err != nil {
			t.Fatal(err)
		}
		code, stderr := run(t, cfg, theirs)
		if !overlayMounted(t, victim) {
			t.Fatalf("a host mount named by another user's record was unmounted (exit %d: %s)", code, stderr)
		}
		if code != exitFailed || !strings.Contains(stderr, "uid 65534") {
			t.Errorf("exit %d, stderr %q: want %d and the owner named", code, stderr, exitFailed)
		}
		if _, err := os.Stat(filepath.Join(theirs, "eve")); !os.IsNotExist(err) {
			t.Errorf("the agent's areas were laid out in another user's areas root: %v", err)
		}
	})
	for _, c := range []struct {
		name, cfg, areas string
		extra            []string
		want             string
	}{
		{"an areas root every user may write", cfg, mkdirOwned(t, filepath.Join(dir, "open"), 0o777, 0), nil, "writable by others"},
		{"a directory every user may write on the way", cfg, filepath.Join(mkdirOwned(t, filepath.Join(dir, "open2"), 0o777, 0), "areas"), nil, "writable by others"},
		{"another user's state directory", cfg, filepath.Join(dir, "areas"),
			[]string{"--state-dir", mkdirOwned(t, filepath.Join(dir, "their-state"), 0o700, otherUser)}, "uid 65534"},
		{"another user's configuration", writeConfig(t, mkdirOwned(t, filepath.Join(dir, "their-cfg"), 0o755, otherUser), ""), filepath.Join(dir, "areas"), nil, "uid 65534"},
		{"a configuration in a directory every user may write", filepath.Join(mkdirOwned(t, filepath.Join(dir, "open-cfg"), 0o777, 0), "sandbox.toml"), filepath.Join(dir, "areas"), nil, "writable by others"},
		{"another user's link to a configuration, in a sticky directory", func() string {
			l := filepath.Join(mkdirOwned(t, filepath.Join(dir, "sticky-link"), 0o777|os.ModeSticky, 0), "sandbox.toml")
			if err := os.Symlink(cfg, l); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(l, otherUser, otherUser); err != nil {
				t.Fatal(err)
			}
			return l
		}(), filepath.Join(dir, "areas"), nil, "uid 65534"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stderr := run(t, c.cfg, c.areas, c.extra...)
			if code != exitFailed || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q: want %d and %q", code, stderr, exitFailed, c.want)
			}
		})
	}
	t.Run("the caller's own, below a sticky directory every user may write, and through its own link", func(t *testing.T) {
		sticky := mkdirOwned(t, filepath.Join(dir, "sticky"), 0o777|os.ModeSticky, 0)
		mine := mkdirOwned(t, filepath.Join(sticky, "mine"), 0o700, 0)
		t.Cleanup(func() { _ = bwrap.DetachTrees(filepath.Join(mine, "areas", ".sandboxctl")) })
		link := filepath.Join(sticky, "cfg-link")
		if err := os.Symlink(cfg, link); err != nil {
			t.Fatal(err)
		}
		if code, stderr := run(t, link, filepath.Join(mine, "areas")); code != 0 {
			t.Errorf("exit %d: %s", code, stderr)
		}
	})
}

// asUser runs this test binary as sandboxctl, as uid and gid otherUser,
// from a copy every user may run.
func asUser(t *testing.T, bin, cwd, home string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = cwd
	cmd.Env = []string{"SANDBOXCTL_TEST_AS_MAIN=1", "HOME=" + home, "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUser, Gid: otherUser, Groups: []uint32{}}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("running sandboxctl as uid %d: %v", otherUser, err)
	return 0, ""
}

// Run by a user other than root, sandboxctl runs the agent's commands as
// that user: whatever the sandbox may write, the agent may write. A
// configuration kept in a project the sandbox mounts read-write was
// rewritten by the agent, and the next command ran with the binaries and
// mounts the agent chose. A configuration whose read-write mount (or area)
// holds the configuration file or the state directory is refused, at each
// generation, before anything runs.
func TestTheSandboxCannotWriteItsOwnConfiguration(t *testing.T) {
	needBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "sandboxctl is run as another user with setuid: run the tests as root (CI does)")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandboxctl")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	home := mkdirOwned(t, filepath.Join(dir, "home"), 0o755, otherUser)
	proj := mkdirOwned(t, filepath.Join(home, "proj"), 0o755, otherUser)
	mkdirOwned(t, filepath.Join(proj, "config"), 0o755, otherUser)
	config := func(mount, mode string) string {
		return fmt.Sprintf("[bwrap]\nbinaries = [\"sh\"]\n[[mounts]]\nsource = %q\ntarget = \"m\"\nmode = %q\n", mount, mode)
	}
	cfg := filepath.Join(proj, "config", "sandbox.toml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(cfg, otherUser, otherUser); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"run", "--allow-unlimited", "--config", cfg, "--agent", "ada", "--areas-root", filepath.Join(home, "agents"), "--"}
	rewrite := "printf '[bwrap]\\nbinaries = [\"sh\", \"cat\"]\\n' > /workspace/m/config/sandbox.toml"

	t.Run("a read-write mount holding the configuration", func(t *testing.T) {
		original := config(proj, "rw")
		write(original)
		code, stderr := asUser(t, bin, proj, home, append(base, "sh", "-c", rewrite)...)
		again, stderr2 := asUser(t, bin, proj, home, append(base, "cat", "/dev/null")...)
		if got, _ := os.ReadFile(cfg); string(got) != original || again == 0 {
			t.Fatalf("the agent rewrote its configuration (exit %d: %s) and the next run took it (exit %d: %s)", code, stderr, again, stderr2)
		}
		if code != exitFailed || !strings.Contains(stderr, "holds "+cfg) {
			t.Errorf("exit %d, stderr %q: want %d and the configuration named", code, stderr, exitFailed)
		}
	})
	t.Run("a read-write mount holding the state directory", func(t *testing.T) {
		write(config(mkdirOwned(t, filepath.Join(home, "agents"), 0o755, otherUser), "rw"))
		code, stderr := asUser(t, bin, proj, home, append(base, "sh", "-c", "true")...)
		if code != exitFailed || !strings.Contains(stderr, "holds "+filepath.Join(home, "agents", ".sandboxctl")) {
			t.Errorf("exit %d, stderr %q: want %d and the state directory named", code, stderr, exitFailed)
		}
	})
	t.Run("a read-only mount holding the configuration", func(t *testing.T) {
		write(config(proj, "ro"))
		if code, stderr := asUser(t, bin, proj, home, append(base, "sh", "-c", "test -f /workspace/m/config/sandbox.toml")...); code != 0 {
			t.Errorf("exit %d: %s", code, stderr)
		}
	})
}
