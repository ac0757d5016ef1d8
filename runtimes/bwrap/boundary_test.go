package bwrap_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// hostSecret is a root-only file outside every area and mount, in a
// directory agents may search: what an escape would reach.
func hostSecret(t *testing.T) (dir, file string) {
	t.Helper()
	dir = testenv.SharedDir(t)
	file = filepath.Join(dir, "secret")
	if err := os.WriteFile(file, []byte("HOST-SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

func TestAgentRunsAsItsOwnUnprivilegedHostID(t *testing.T) {
	s := newSandbox(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"sh", "id"}}, nil, bwrap.Host{})
	code, out, stderr := s.sh(t, `id -u; id -g; echo x > /workspace/mine`)
	if code != 0 {
		t.Fatalf("exit %d stderr %q", code, stderr)
	}
	want := fmt.Sprintf("%d\n%d\n", s.in.Identity.UID, s.in.Identity.GID)
	if s.in.Identity.UID == 0 || out != want {
		t.Fatalf("id inside prints %q, want the agent's unprivileged id %q", out, want)
	}
	fi, err := os.Stat(filepath.Join(s.agentDir, "workspace", "mine"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != s.in.Identity.UID || st.Gid != s.in.Identity.GID {
		t.Fatalf("the file the agent wrote is owned by %d:%d on the host, want %d", st.Uid, st.Gid, s.in.Identity.UID)
	}
}

func TestAgentCannotReadRootOnlyHostFiles(t *testing.T) {
	_, secret := hostSecret(t)
	dir := filepath.Dir(secret)
	s := newSandbox(t, v1alpha1.SandboxSpec{
		Binaries: []v1alpha1.BinaryName{"sh", "cat"},
		Mounts:   []v1alpha1.Mount{{Source: dir, Target: "shared", Mode: v1alpha1.MountReadOnly}},
	}, nil, bwrap.Host{})
	code, out, _ := s.sh(t, `cat /workspace/shared/secret`)
	if code == 0 || strings.Contains(out, "HOST-SECRET") {
		t.Fatalf("a root-only file in a mounted host directory was read: exit %d %q", code, out)
	}
}

func TestOnlyAllowedCommandsExist(t *testing.T) {
	testenv.Binary(t, "git", "install git (hack/install-deps.sh)")
	t.Run("git alone finds no shell", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"git"}}, nil, bwrap.Host{})
		code, out, stderr := s.exec(t, "git", "-c", "alias.x=!id; ls /usr/bin", "x")
		if code == 0 || strings.Contains(out, "uid=") {
			t.Fatalf("git's ! alias ran a shell: exit %d stdout %q stderr %q", code, out, stderr)
		}
		code, out, stderr = s.exec(t, "git", "--version")
		if code != 0 || !strings.HasPrefix(out, "git version") {
			t.Fatalf("the allowed command itself does not run: exit %d %q %q", code, out, stderr)
		}
	})
	t.Run("the command directories list only the allowlist", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"sh", "ls"}}, nil, bwrap.Host{})
		code, out, stderr := s.sh(t, `for d in /usr/bin /bin /usr/sbin /sbin /usr/local/bin; do ls -A $d; done | sort -u`)
		if code != 0 {
			// sort is not allowed; list without it.
			code, out, stderr = s.sh(t, `for d in /usr/bin /bin /usr/sbin /sbin /usr/local/bin; do ls -A $d; done`)
		}
		if code != 0 {
			t.Fatalf("exit %d stderr %q", code, stderr)
		}
		for _, name := range strings.Fields(out) {
			if name != "sh" && name != "ls" {
				t.Fatalf("%q is visible in a command directory; only sh and ls are allowed (all: %q)", name, out)
			}
		}
	})
}

// The first attack of the review: an agent turns the path of the first
// custom mount's destination into links so that binding it lands on the
// host directory holding the second mount's source, whose place then holds
// a link to the host's /.
func TestLinkedMountDestinationsNeverRedirectBinds(t *testing.T) {
	hostDir, secret := hostSecret(t)
	appSrc := filepath.Join(hostDir, "app")
	toolsParent := filepath.Join(hostDir, "tools-parent")
	toolsSrc := filepath.Join(toolsParent, "tools")
	for _, d := range []string{appSrc, toolsSrc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := newSandbox(t, v1alpha1.SandboxSpec{
		Binaries: []v1alpha1.BinaryName{"sh", "cat", "mv", "ln", "mkdir", "rm"},
		Mounts: []v1alpha1.Mount{
			{Source: appSrc, Target: "src/app", Mode: v1alpha1.MountReadWrite},
			{Source: toolsSrc, Target: "tools", Mode: v1alpha1.MountReadWrite},
		},
	}, nil, bwrap.Host{})
	testenv.GiveTo(t, s.in.Identity.UID, appSrc, toolsSrc)
	for _, oldroot := range []string{"", "/oldroot"} {
		t.Run("links into "+oldroot+"/", func(t *testing.T) {
			script := fmt.Sprintf(`set -e
mv /workspace/src /workspace/src.%[1]d
mkdir -p /workspace/stage%[1]d
ln -s %[2]s%[3]s /workspace/stage%[1]d/app
ln -sfn stage%[1]d /workspace/src
ln -s / /workspace/src.%[1]d/app/tools || true`, len(oldroot), oldroot, toolsParent)
			if code, _, stderr := s.sh(t, script); code != 0 {
				t.Fatalf("setting up the links: exit %d %q", code, stderr)
			}
			var out, errb bytes.Buffer
			st, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{
				Argv:   []string{"sh", "-c", "cat /workspace/tools" + secret + "; echo owned > /workspace/tools" + hostDir + "/planted"},
				Stdout: &out, Stderr: &errb,
			})
			if strings.Contains(out.String(), "HOST-SECRET") {
				t.Fatalf("the host file was read through a redirected bind: %q", out.String())
			}
			if _, statErr := os.Lstat(filepath.Join(hostDir, "planted")); statErr == nil {
				t.Fatal("a file was written on the host through a redirected bind")
			}
			if err == nil && st.Code == 0 {
				t.Fatalf("the command ran as if nothing happened: %q %q", out.String(), errb.String())
			}
			// Nothing was mounted on the host where the links pointed.
			assertNotMountPoint(t, toolsParent)
			assertNotMountPoint(t, toolsSrc)
			// The agent puts its workspace back; the mounts are in place again.
			if code, _, stderr := s.sh(t, fmt.Sprintf(`rm -f /workspace/src && mv /workspace/src.%d /workspace/src && echo ok > /workspace/src/app/back`, len(oldroot))); code != 0 {
				t.Fatalf("restoring: exit %d %q", code, stderr)
			}
			if b, err := os.ReadFile(filepath.Join(appSrc, "back")); err != nil || string(b) != "ok\n" {
				t.Fatalf("src/app is not bound from its source after the workspace is restored: %q %v", b, err)
			}
			if err := os.Remove(filepath.Join(appSrc, "tools")); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		})
	}
}

// The second attack: through the file access the controller offers, a
// caller removes a mount point by a path through a link the agent made
// (l -> .); the agent would then put a link in its place.
func TestMountPointsCannotBeRemovedThroughFileAccess(t *testing.T) {
	hostDir := testenv.SharedDir(t)
	project := filepath.Join(hostDir, "project")
	if err := os.MkdirAll(project, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(project, "keep"), []byte("data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t, v1alpha1.SandboxSpec{
		Binaries: []v1alpha1.BinaryName{"sh", "ln", "cat"},
		Mounts:   []v1alpha1.Mount{{Source: project, Target: "project", Mode: v1alpha1.MountReadWrite}},
	}, nil, bwrap.Host{})
	testenv.GiveTo(t, s.in.Identity.UID, project)
	if code, _, stderr := s.sh(t, `ln -s . /workspace/l`); code != 0 {
		t.Fatalf("exit %d %q", code, stderr)
	}
	view, err := s.in.FileView()
	if err != nil {
		t.Fatal(err)
	}
	root, rel, err := view.Resolve("/workspace/l/project")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Remove(rel, true); err == nil {
		t.Fatal("the mount point was removed through a linked path")
	}
	if b, err := os.ReadFile(filepath.Join(project, "keep")); err != nil || string(b) != "data\n" {
		t.Fatalf("the mount's source lost a file: %q %v", b, err)
	}
	if code, out, _ := s.sh(t, `cat /workspace/project/keep`); code != 0 || out != "data\n" {
		t.Fatalf("the mount is gone from the sandbox: exit %d %q", code, out)
	}
}

// Agent processes swap a mount destination's parent with a link (to the
// sandbox's root and to a host directory) with renameat2(RENAME_EXCHANGE)
// in a loop while commands start. Each command sees the mount's own file or
// fails; none sees the host, and nothing is mounted on the host.
func TestMountDestinationExchangeRace(t *testing.T) {
	testenv.Binary(t, "python3", "install python3")
	hostDir := testenv.SharedDir(t)
	src := filepath.Join(hostDir, "src")
	decoy := filepath.Join(hostDir, "decoy", "b")
	for _, d := range []string{src, decoy} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "marker"), []byte("MOUNT\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(decoy, "marker"), []byte("HOST\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t, v1alpha1.SandboxSpec{
		Binaries: []v1alpha1.BinaryName{"sh", "cat", "python3"},
		Mounts:   []v1alpha1.Mount{{Source: src, Target: "a/b", Mode: v1alpha1.MountReadOnly}},
	}, nil, bwrap.Host{})
	const swapper = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace")
for i, target in enumerate(sys.argv[1:]):
    os.symlink(target, "l%d" % i)
n = 0
while True:
    libc.renameat2(-100, b"a", -100, b"l%d" % (n % (len(sys.argv) - 1)), 2)
    n += 1
`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var swappers sync.WaitGroup
	// One swapper: a second only takes the CPU the command starts need.
	for i := range 1 {
		swappers.Add(1)
		go func() {
			defer swappers.Done()
			_, _ = s.rt.Exec(ctx, s.in.Name, runtimes.ExecRequest{Argv: []string{"python3", "-c", swapper,
				"/", filepath.Dir(decoy), "/oldroot" + filepath.Dir(decoy), strconv.Itoa(i)}})
		}()
	}
	starts := testenv.RaceStarts(1000)
	// A start that hangs, or a machine too slow to finish, ends the test
	// with the count so far instead of the package's timeout.
	budget := 25 * time.Minute
	deadline := time.Now().Add(budget)
	var ran, escapes, done atomic.Int64
	var workers sync.WaitGroup
	next := atomic.Int64{}
	for range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for next.Add(1) <= int64(starts) && time.Now().Before(deadline) {
				var out bytes.Buffer
				ectx, ecancel := context.WithTimeout(context.Background(), 2*time.Minute)
				st, err := s.rt.Exec(ectx, s.in.Name, runtimes.ExecRequest{
					Argv: []string{"cat", "/workspace/a/b/marker"}, Stdout: &out, Stderr: &bytes.Buffer{}})
				ecancel()
				done.Add(1)
				if strings.Contains(out.String(), "HOST") {
					escapes.Add(1)
				}
				if err == nil && st.Code == 0 && out.String() == "MOUNT\n" {
					ran.Add(1)
				}
			}
		}()
	}
	workers.Wait()
	cancel()
	swappers.Wait()
	t.Logf("%d command starts, %d saw the mount, %d escapes", done.Load(), ran.Load(), escapes.Load())
	if escapes.Load() != 0 {
		t.Fatalf("%d of %d commands read the host through a swapped mount destination", escapes.Load(), done.Load())
	}
	if done.Load() < int64(starts) {
		t.Fatalf("only %d of %d command starts within %s", done.Load(), starts, budget)
	}
	assertNotMountPoint(t, decoy)
	assertNotMountPoint(t, filepath.Dir(decoy))
	if b, err := os.ReadFile(filepath.Join(decoy, "marker")); err != nil || string(b) != "HOST\n" {
		t.Fatalf("the host directory changed: %q %v", b, err)
	}
}

func assertNotMountPoint(t *testing.T, p string) {
	t.Helper()
	var st, parent syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return
	}
	if err := syscall.Lstat(filepath.Dir(p), &parent); err != nil {
		t.Fatal(err)
	}
	if st.Dev != parent.Dev {
		t.Fatalf("%s is a mount point on the host: a bind landed where a link pointed", p)
	}
}

// bubblewrap hands its command whatever it inherits, and the controller
// inherits whatever its starter (a shell, a terminal, a supervisor) left
// open without close-on-exec: a file, or a directory outside every mount,
// through which the agent would read or walk the host. None of it reaches
// the agent, whichever way a command starts on cgroup v1.
func TestDescriptorsTheControllerInheritedNeverReachTheAgent(t *testing.T) {
	// A directory only root may search, holding a file anyone may read:
	// the agent reaches it through a descriptor of the directory alone.
	dir := filepath.Join(testenv.SharedDir(t), "root-only")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte("HOST-FILE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opened, err := unix.Open(filepath.Join(dir, "marker"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(opened)
	openedDir, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(openedDir)
	// Above the descriptors a start hands down itself, which would take
	// their numbers in the child.
	const file, outside = 200, 201
	defer unix.Close(file)
	defer unix.Close(outside)
	for _, start := range []string{bwrap.StartAuto, bwrap.StartStarter, bwrap.StartMove} {
		t.Run(start, func(t *testing.T) {
			// Inherited (no close-on-exec) again for each: a start before
			// marked them.
			if err := errors.Join(unix.Dup3(opened, file, 0), unix.Dup3(openedDir, outside, 0)); err != nil {
				t.Fatal(err)
			}
			s := newSandboxStarting(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"sh", "cat"}}, nil, bwrap.Host{}, start)
			code, out, stderr := s.sh(t, fmt.Sprintf("cat /proc/self/fd/%d/marker; for f in /proc/self/fd/*; do echo ${f##*/}; done", outside))
			if strings.Contains(out, "HOST-FILE") {
				t.Fatalf("the agent read a host file outside its mounts through a descriptor the controller inherited (exit %d): %q", code, out)
			}
			fds := strings.Fields(out)
			if !slices.Contains(fds, "0") {
				t.Fatalf("the command listed no descriptors: %q (stderr %q)", out, stderr)
			}
			for _, fd := range []int{file, outside} {
				if slices.Contains(fds, strconv.Itoa(fd)) {
					t.Errorf("the agent's command holds descriptor %d the controller inherited: %q", fd, out)
				}
			}
			// The controller's own descriptors are its own still.
			if _, err := unix.Seek(file, 0, 0); err != nil {
				t.Errorf("the inherited descriptor is no longer the controller's: %v", err)
			}
		})
	}
}
