package bwrap_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const imageContainer = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// imageBundles lays out a container runtime's bundle directory holding one
// container whose root file system (a tmpfs of its own, as a snapshot is
// mounted) is a hostile image: busybox reached through absolute and
// relative links, and links, a FIFO and a directory that try to pass host
// commands off as the image's.
func imageBundles(t *testing.T) (bundles, rootfs string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "run as root: the test mounts a container's root file system")
	}
	bb := testenv.Binary(t, "busybox", "install busybox-static (hack/install-deps.sh)")
	bundles = filepath.Join(testenv.SharedDir(t), "bundles")
	rootfs = filepath.Join(bundles, imageContainer, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	// containerd keeps its bundles to itself: no agent may search them.
	if err := os.Chmod(filepath.Dir(rootfs), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", rootfs, "tmpfs", 0, "mode=0755,size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(rootfs, unix.MNT_DETACH) })

	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"usr/lib/bb", "usr/bin/wc", "etc/ssl"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(rootfs, p), []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("usr/lib/bb/busybox", string(data), 0o755)
	write("etc/passwd", "root:x:0:0::/root:/bin/sh\nimagemarker:x:7:7::/:/bin/sh\n", 0o644)
	links := map[string]string{
		"usr/bin/sh":  "/usr/lib/bb/busybox", // absolute: the image's root
		"usr/bin/cat": "/usr/lib/bb/busybox",
		"usr/bin/ls":  "../lib/bb/busybox",
		// Escapes the image when resolved as a host path: the node's.
		"usr/bin/env":  "../../../../../../../../../usr/bin/env",
		"usr/bin/stat": "/proc/self/root/usr/bin/stat",
		"usr/bin/tr":   "/usr/bin/tr-host",
		"bin":          "usr/bin",
		"lib64":        "/etc",
	}
	for p, target := range links {
		if err := os.Symlink(target, filepath.Join(rootfs, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(rootfs, "usr/bin/head"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bundles, rootfs
}

// lastStateDir is the state directory of the last imageSandbox.
var lastStateDir string

func imageSandbox(t *testing.T, bundles, container string) (*bwrap.Runtime, runtimes.Instance, error) {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh); in CI a missing bwrap fails these tests")
	dir := testenv.SharedDir(t)
	lastStateDir = filepath.Join(dir, "state")
	rt, err := bwrap.New(bwrap.Config{StateDir: lastStateDir, ContainerBundles: bundles, Warnings: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	spec := v1alpha1.SandboxSpec{
		Agent: "ida", Bwrap: &v1alpha1.BwrapSpec{Image: "example.test/tools:1"},
		Binaries: []v1alpha1.BinaryName{"sh", "cat", "ls", "env", "stat", "tr", "head", "wc"},
	}
	in, err := instance.Standalone(&spec, instance.Host{AreasRoot: filepath.Join(dir, "areas"), Home: dir})
	if err != nil {
		t.Fatal(err)
	}
	in.ImageContainer = container
	in.ConfigHash = in.Hash()
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	_, err = rt.Ensure(context.Background(), in)
	return rt, in, err
}

func TestImageIsTheSystemAndItsLinksResolveInsideIt(t *testing.T) {
	bundles, _ := imageBundles(t)
	rt, in, err := imageSandbox(t, bundles, imageContainer)
	if err != nil {
		t.Fatal(err)
	}
	run := func(argv ...string) (int, string, string, error) {
		var out, errb bytes.Buffer
		st, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
		return st.Code, out.String(), errb.String(), err
	}
	code, out, stderr, err := run("sh", "-c", "echo from-image; cat /etc/passwd; ls /usr/bin; readlink /lib64; test -e /usr/lib/os-release && echo node-usr-visible; id -u")
	if err != nil || code != 0 {
		t.Fatalf("sh in the image: code %d, err %v, stderr %q", code, err, stderr)
	}
	lines := strings.Fields(out)
	if lines[0] != "from-image" || !strings.Contains(out, "imagemarker") {
		t.Errorf("the command did not run from the image or did not read its /etc/passwd: %q", out)
	}
	if !strings.Contains(out, "cat\nls\nsh\n") || strings.Contains(out, "env") || strings.Contains(out, "stat") {
		t.Errorf("/usr/bin should hold exactly the allowlisted commands the image has (cat ls sh): %q", out)
	}
	if !strings.Contains(out, "/etc\n") {
		t.Errorf("the image's link /lib64 -> /etc should be made again inside the sandbox: %q", out)
	}
	if strings.Contains(out, "node-usr-visible") {
		t.Errorf("the node's /usr is visible next to the image's: %q", out)
	}
	if id := lines[len(lines)-1]; id == "0" {
		t.Errorf("the command ran as uid 0")
	}

	// A link out of the image (relative or through /proc), a link to a
	// path only the node has, a FIFO and a directory are no commands: the
	// node's env, stat and tr are never run in their place, and the FIFO
	// is never opened for reading (the call would hang).
	for _, name := range []string{"env", "stat", "tr", "head", "wc"} {
		_, _, _, err := run(name, "--help")
		if err == nil || !strings.Contains(err.Error(), "not in the image") {
			t.Errorf("%s: want a refusal saying it is not in the image, got %v", name, err)
		}
	}

	// The image is mounted where the agent may search it while the
	// instance runs, and nowhere once it stops.
	mounts := filepath.Join(bwrap.TreesDir(lastStateDir), ".images")
	if n := testenv.MountsBelow(t, mounts); n != 1 {
		t.Errorf("%d mounts below %s while the instance runs, want its one image mount", n, mounts)
	}
	if err := rt.Stop(context.Background(), in.Name); err != nil {
		t.Fatal(err)
	}
	if n := testenv.MountsBelow(t, mounts); n != 0 {
		t.Errorf("%d mounts left below %s once the instance stopped", n, mounts)
	}
}

func TestImageRootMustBeTheMountedRootOfThatContainer(t *testing.T) {
	bundles, rootfs := imageBundles(t)
	if _, _, err := imageSandbox(t, bundles, "../"+imageContainer[3:]); err == nil || !strings.Contains(err.Error(), "64 hexadecimal digits") {
		t.Errorf("a container ID of another shape: got %v", err)
	}
	other := strings.Repeat("f", 64)
	if _, _, err := imageSandbox(t, bundles, other); err == nil || !strings.Contains(err.Error(), "not on this node") {
		t.Errorf("a container without a bundle: got %v", err)
	}
	// A bundle whose rootfs is a link to the node's root.
	linked := strings.Repeat("e", 64)
	if err := os.MkdirAll(filepath.Join(bundles, linked), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(bundles, linked, "rootfs")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := imageSandbox(t, bundles, linked); err == nil || !strings.Contains(err.Error(), "root file system") {
		t.Errorf("a rootfs that is a link: got %v", err)
	}
	// The container stopped: its rootfs is an empty directory again.
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if _, _, err := imageSandbox(t, bundles, imageContainer); err == nil || !strings.Contains(err.Error(), "not mounted") {
		t.Errorf("an unmounted root: got %v", err)
	}
	_, _, err := imageSandbox(t, "", imageContainer)
	if err == nil || !strings.Contains(err.Error(), "--container-bundles") {
		t.Errorf("a driver without the bundles directory: got %v", err)
	}
	var rerr *runtimes.Error
	if !errors.As(err, &rerr) || rerr.Reason != runtimes.ReasonUnavailable {
		t.Errorf("want ReasonUnavailable, got %#v", err)
	}
}

// An image mount whose instance is no longer recorded (a controller that
// died between a command and the instance's removal) goes at the next
// start, like a tree; but not one just made, whose instance a start in
// another process is about to record.
func TestUnrecordedImageMountsGoAtTheNextStart(t *testing.T) {
	bundles, rootfs := imageBundles(t)
	// The image is old: what is young is its mount.
	long := time.Now().Add(-24 * time.Hour)
	if err := os.Chtimes(rootfs, long, long); err != nil {
		t.Fatal(err)
	}
	rt, in, err := imageSandbox(t, bundles, imageContainer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", "true"}}); err != nil {
		t.Fatal(err)
	}
	mounts := filepath.Join(bwrap.TreesDir(lastStateDir), ".images")
	if n := testenv.MountsBelow(t, mounts); n != 1 {
		t.Fatalf("%d mounts below %s after a command, want the image's", n, mounts)
	}
	if err := os.Remove(filepath.Join(lastStateDir, in.Name+".json")); err != nil {
		t.Fatal(err)
	}
	if _, err := bwrap.New(bwrap.Config{StateDir: lastStateDir, Warnings: &bytes.Buffer{}}); err != nil {
		t.Fatal(err)
	}
	if n := testenv.MountsBelow(t, mounts); n != 1 {
		t.Fatalf("%d mounts below %s after a start just after the mount was made, want the image's still", n, mounts)
	}
	// A minute on, nothing has recorded it.
	defer bwrap.SetStaleClock(func() time.Time { return time.Now().Add(2 * time.Minute) })()
	if _, err := bwrap.New(bwrap.Config{StateDir: lastStateDir, Warnings: &bytes.Buffer{}}); err != nil {
		t.Fatal(err)
	}
	if n := testenv.MountsBelow(t, mounts); n != 0 {
		t.Errorf("%d mounts below %s after a start that records no instance", n, mounts)
	}
}

// The image's descriptors (one for each allowlisted command in each
// command directory, each system directory, each /etc file) are
// bubblewrap's once it has started: the controller holds none of them for
// the life of a command, however many commands run.
func TestARunningCommandLeavesTheControllerNoneOfTheImagesDescriptors(t *testing.T) {
	bundles, _ := imageBundles(t)
	rt, in, err := imageSandbox(t, bundles, imageContainer)
	if err != nil {
		t.Fatal(err)
	}
	const commands = 4
	type running struct {
		in   *os.File
		done chan error
	}
	var all []running
	for range commands {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		done := make(chan error, 1)
		go func() {
			var errb bytes.Buffer
			st, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", "read line && echo got"}, Stdin: r, Stderr: &errb})
			if err == nil && st.Code != 0 {
				err = errors.New("exit " + strings.TrimSpace(errb.String()))
			}
			done <- err
		}()
		all = append(all, running{in: w, done: done})
	}
	// Each command has started once its sandbox's mounts are in place;
	// give them that, then count.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && countProcs(t, in) < commands {
		time.Sleep(50 * time.Millisecond)
	}
	if n := countProcs(t, in); n < commands {
		t.Fatalf("%d of %d commands run as the agent after 30 s", n, commands)
	}
	images := filepath.Join(bwrap.TreesDir(lastStateDir), ".images") + "/"
	held := testenv.OpenDescriptors(t, func(target string) bool { return strings.HasPrefix(target, images) })
	for _, c := range all {
		if _, err := c.in.WriteString("line\n"); err != nil {
			t.Fatal(err)
		}
		if err := <-c.done; err != nil {
			t.Fatalf("a command of the image: %v", err)
		}
	}
	if held != 0 {
		t.Errorf("the controller held %d descriptors of the image while %d commands ran, want none", held, commands)
	}
}

// countProcs counts the processes running as in's agent.
func countProcs(t *testing.T, in runtimes.Instance) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name()), &st) == nil && st.Uid == in.Identity.UID && e.Name()[0] >= '0' && e.Name()[0] <= '9' {
			if comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.TrimSpace(string(comm)) == "sh" {
				n++
			}
		}
	}
	return n
}
