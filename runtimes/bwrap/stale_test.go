package bwrap_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/osthread"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The trees of a state directory that is gone (a deleted clone, a test's
// throw-away areas) are removed by the next driver that starts on the
// host, whatever its own state directory: 1,000 abandoned trees, and
// their mounts, are gone after it, and a command runs as before.
func TestAbandonedTreesGoAtTheNextStart(t *testing.T) {
	needTrees(t)
	dir := t.TempDir()
	clone := filepath.Join(dir, "clone")
	state := filepath.Join(clone, "state")
	rt, err := bwrap.New(bwrap.Config{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	trees := bwrap.TreesDir(state)
	const n = 1000
	for i := range n {
		spec := v1alpha1.SandboxSpec{Agent: fmt.Sprintf("gone-%d", i), Binaries: []v1alpha1.BinaryName{"true"}}
		in, err := instance.Standalone(&spec, instance.Host{AreasRoot: filepath.Join(clone, "areas")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Ensure(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	if got := testenv.MountsBelow(t, trees); got < n {
		t.Fatalf("%d mounts below %s after %d instances, want at least %d", got, trees, n, n)
	}
	cgroups, err := cgroup.ParentDirs(bwrap.CgroupName(state))
	if err != nil || len(cgroups) == 0 {
		t.Fatalf("where the driver's cgroups are: %v %v", cgroups, err)
	}
	for _, dir := range cgroups {
		if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
			t.Fatalf("the instances' cgroups are not in %s: %v", dir, err)
		}
	}
	// The clone is deleted, its controller never to come back.
	if err := os.RemoveAll(clone); err != nil {
		t.Fatal(err)
	}

	next, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(dir, "next", "state")})
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.MountsBelow(t, trees); got != 0 {
		t.Fatalf("%d mounts of the abandoned trees left after the next start", got)
	}
	if _, err := os.Lstat(trees); !os.IsNotExist(err) {
		t.Fatalf("the abandoned trees' directory %s is still there: %v", trees, err)
	}
	// Their cgroups, empty, go with them.
	for _, dir := range cgroups {
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Fatalf("the abandoned state directory's cgroup %s is still there: %v", dir, err)
		}
	}
	spec := v1alpha1.SandboxSpec{Agent: "after", Binaries: []v1alpha1.BinaryName{"true"}}
	in, err := instance.Standalone(&spec, instance.Host{AreasRoot: filepath.Join(dir, "next", "areas")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = bwrap.DetachTrees(filepath.Join(dir, "next", "state"))
		_ = bwrap.RemoveCgroups(filepath.Join(dir, "next", "state"))
	}()
	st, err := next.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"true"}})
	if err != nil || st.Code != 0 {
		t.Fatalf("a command after the sweep: %+v %v", st, err)
	}
}

// DetachTrees, a test's or an administrator's cleanup of a state
// directory, takes the cgroups its driver made where nothing runs:
// otherwise every throw-away state directory leaves its cgroups on the
// host.
func TestDetachTreesTakesTheIdleCgroups(t *testing.T) {
	needTrees(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	rt, err := bwrap.New(bwrap.Config{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	spec := v1alpha1.SandboxSpec{Agent: "detached", Binaries: []v1alpha1.BinaryName{"true"}}
	in, err := instance.Standalone(&spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	cgroups, err := cgroup.ParentDirs(bwrap.CgroupName(state))
	if err != nil || len(cgroups) == 0 {
		t.Fatalf("where the driver's cgroups are: %v %v", cgroups, err)
	}
	if _, err := os.Stat(cgroups[0]); err != nil {
		t.Fatalf("the instance's cgroup parent is not there: %v", err)
	}
	if err := bwrap.DetachTrees(state); err != nil {
		t.Fatal(err)
	}
	for _, dir := range cgroups {
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("the detached state directory's cgroup %s is still there: %v", dir, err)
		}
	}
}

// needTrees fails (in CI) or skips a test that builds mount trees where
// they cannot be built.
// holdStateEnv makes the test binary a driver that holds the state
// directory it names, until its standard input closes: another process.
const holdStateEnv = "BWRAP_TEST_HOLD_STATE"

func TestMain(m *testing.M) {
	if state := os.Getenv(holdStateEnv); state != "" {
		if _, err := bwrap.New(bwrap.Config{StateDir: state}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("holding")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process with a /tmp of its own (a service with systemd's PrivateTmp)
// does not see a live state directory below the host's /tmp: its start or
// gc must not take the trees of a driver running over that directory for
// abandoned and detach them from under it.
func TestTreesOfALiveStateDirectoryOutOfSightStay(t *testing.T) {
	needTrees(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "hidden", "state")
	trees := bwrap.TreesDir(state)
	defer func() { _ = bwrap.DetachTrees(state) }()

	driver := exec.Command(os.Args[0])
	driver.Env = append(os.Environ(), holdStateEnv+"="+state)
	stdin, err := driver.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := driver.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	driver.Stderr = os.Stderr
	if err := driver.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = driver.Process.Kill(); _ = driver.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "holding\n" {
		t.Fatalf("the driver over %s did not start: %q %v", state, line, err)
	}
	// Only root may open the owner file, and so hold it: a user holding
	// it would keep the trees of a gone state directory from every sweep.
	if fi, err := os.Lstat(filepath.Join(trees, ".state-dir")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the owner file of %s: %v, want it root's alone (0600)", trees, err)
	}

	// What a sweep over another state directory finds abandoned, in a
	// mount namespace of its own, private, where an empty tmpfs hides the
	// state directory's parent.
	outOfSight := func() map[string]string {
		var st bwrap.StaleTrees
		if err := osthread.Disposable(func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", filepath.Join(dir, "hidden"), "tmpfs", 0, ""); err != nil {
				return err
			}
			if _, err := os.Lstat(state); !os.IsNotExist(err) {
				return fmt.Errorf("the state directory is still in sight: %w", err)
			}
			var err error
			st, err = bwrap.FindStaleTrees(filepath.Join(dir, "other", "state"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return st.Abandoned
	}
	if got := outOfSight(); got[trees] != "" {
		t.Fatalf("a process that cannot see the live state directory %s took its trees for abandoned", state)
	}
	// Its driver gone, nothing tells a process that cannot see the
	// directory that it lives.
	stdin.Close()
	if err := driver.Wait(); err != nil {
		t.Fatalf("the driver: %v", err)
	}
	if got := outOfSight(); got[trees] != state {
		t.Fatalf("the trees of %s, held by no process and out of sight, are not abandoned: %v", state, got)
	}
}

func needTrees(t *testing.T) {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mount trees are built only as root: run the tests as root (CI does)")
	}
}
