package startns_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/mountinfo"
	"github.com/cireilclaw/sandbox-controller/internal/startns"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "start namespaces are made only as root: run the tests as root (CI does)")
	}
}

// mount mounts (a bind, or a tmpfs when src is empty) at dst, and takes it
// away when the test ends.
func mount(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	var err error
	if src == "" {
		err = unix.Mount("tmpfs", dst, "tmpfs", 0, "size=64k")
	} else {
		err = unix.Mount(src, dst, "", unix.MS_BIND, "")
	}
	if err != nil {
		t.Fatalf("mounting at %s: %v", dst, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dst, unix.MNT_DETACH) })
}

// treesDir makes dir/trees an unbindable mount, as the driver's trees'
// directory is, and returns it.
func treesDir(t *testing.T, dir string) string {
	t.Helper()
	top := filepath.Join(dir, "trees")
	mount(t, top, top)
	if err := unix.Mount("", top, "", unix.MS_UNBINDABLE, ""); err != nil {
		t.Fatal(err)
	}
	return top
}

// mountPoints are the mount points of a mount table.
func mountPoints(table string) map[string]bool {
	points := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			points[mountinfo.Unescape(f[4])] = true
		}
	}
	return points
}

// A start namespace holds the host's mounts of the moment, none of the
// trees below the unbindable trees' directory, and the tree mounts it is
// given, at their paths.
func TestAStartNamespaceHoldsTheHostLessTheTreesAndItsOwnTree(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	top := treesDir(t, dir)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "mark"), []byte("ann's"), 0o600); err != nil {
		t.Fatal(err)
	}
	own, other := filepath.Join(top, "ann", "0", "workspace"), filepath.Join(top, "bob", "0", "workspace")
	mount(t, src, own)
	mount(t, src, other)
	ns := startns.New(top)
	// A host mount made after the first start namespace: the next one
	// has it.
	if err := ns.Run(nil, nil, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(dir, "outside")
	mount(t, "", outside)

	var table, mark string
	err := ns.Run([]string{own}, nil, func() error {
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return err
		}
		table = string(b)
		m, err := os.ReadFile(filepath.Join(own, "mark"))
		mark = string(m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	points := mountPoints(table)
	if !points[own] || mark != "ann's" {
		t.Errorf("ann's tree mount is not in the start namespace (mark %q)", mark)
	}
	if points[other] {
		t.Errorf("bob's tree mount %s is in ann's start namespace", other)
	}
	if !points[outside] {
		t.Errorf("the host's mount %s, made before the start, is not in its namespace", outside)
	}
	if !points["/proc"] {
		t.Errorf("the host's /proc is not in the start namespace")
	}
	// And the host still has both trees.
	host := mountPoints(readFile(t, "/proc/self/mountinfo"))
	if !host[own] || !host[other] {
		t.Errorf("a tree mount left the host: ann's %v, bob's %v", host[own], host[other])
	}
}

// A start namespace goes without the mounts at and below the directories
// it drops (the node runtime's containers' root file systems, one mount a
// container): below a plain directory, as on a node, and at and below a
// mount that receives them, as in the controller's Pod. The host keeps
// them.
func TestAStartNamespaceGoesWithoutTheDroppedMounts(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src := t.TempDir()
	bundles := filepath.Join(dir, "bundles")
	for i := range 3 {
		mount(t, src, filepath.Join(bundles, strconv.Itoa(i), "rootfs"))
	}
	received := filepath.Join(dir, "received")
	mount(t, "", received)
	mount(t, src, filepath.Join(received, "c", "rootfs"))
	var table string
	err := startns.New("", bundles, received).Run(nil, nil, func() error {
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		table = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	points := mountPoints(table)
	if !points["/proc"] {
		t.Fatalf("the start namespace has no /proc:\n%s", table)
	}
	for p := range points {
		if strings.HasPrefix(p, bundles+"/") || p == received || strings.HasPrefix(p, received+"/") {
			t.Errorf("the start namespace has %s", p)
		}
	}
	host := mountPoints(readFile(t, "/proc/self/mountinfo"))
	for _, p := range []string{filepath.Join(bundles, "0", "rootfs"), filepath.Join(received, "c", "rootfs")} {
		if !host[p] {
			t.Errorf("the host lost %s", p)
		}
	}
}

// A tree mount is reached beneath the trees' directory without following
// a link: a link on its way (to another instance's tree, or a magic link
// into /proc) makes the start namespace unavailable instead of holding
// what the link names.
func TestALinkOnTheWayToATreeMountIsNotFollowed(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	top := treesDir(t, dir)
	src := t.TempDir()
	other := filepath.Join(top, "bob", "0")
	mount(t, src, filepath.Join(other, "workspace"))
	for name, target := range map[string]string{"ann": other, "eve": "/proc/self/root" + other} {
		if err := os.Symlink(target, filepath.Join(top, name)); err != nil {
			t.Fatal(err)
		}
		called := false
		err := startns.New(top).Run([]string{filepath.Join(top, name, "workspace")}, nil, func() error { called = true; return nil })
		if !errors.Is(err, startns.ErrUnavailable) || called {
			t.Errorf("%s's link to %s: err %v, called %v; want ErrUnavailable and no call", name, target, err, called)
		}
	}
}

// Nothing mounted in a start namespace reaches the host, even below a
// mount the host shares (as / is under systemd): the clone of the host's
// mounts is made private before anything is attached.
func TestNothingMountedInAStartNamespaceReachesTheHost(t *testing.T) {
	needRoot(t)
	shared := filepath.Join(t.TempDir(), "shared")
	mount(t, "", shared)
	if err := unix.Mount("", shared, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(shared, "inside")
	if err := os.Mkdir(inside, 0o700); err != nil {
		t.Fatal(err)
	}
	// With all of the host's mounts, and with the shared mount as a bind
	// a start names.
	for _, host := range []*startns.Host{nil, {Binds: []string{shared}}} {
		err := startns.New("").RunWith(nil, host, nil, func() error {
			return unix.Mount("tmpfs", inside, "tmpfs", 0, "size=64k")
		})
		if err != nil {
			t.Fatal(err)
		}
		if mountPoints(readFile(t, "/proc/self/mountinfo"))[inside] {
			_ = unix.Unmount(inside, unix.MNT_DETACH)
			t.Fatalf("a mount made in a start namespace (named %v) appeared on the host at %s", host != nil, inside)
		}
	}
}

// The thread of a start namespace ends with it: no thread of the process
// stays outside its mount namespace, the main one included.
func TestNoThreadStaysInAStartNamespace(t *testing.T) {
	needRoot(t)
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	ns := startns.New("")
	for range 50 {
		var theirs string
		if err := ns.Run(nil, nil, func() error {
			var err error
			theirs, err = os.Readlink("/proc/thread-self/ns/mnt")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if theirs == own {
			t.Fatal("the work ran in the process's own mount namespace")
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/mnt")
		var stray []string
		for _, task := range tasks {
			if theirs, err := os.Readlink(task); err == nil && theirs != own {
				stray = append(stray, task)
			}
		}
		if len(stray) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads still outside the process's mount namespace: %v", stray)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if now, _ := os.Readlink("/proc/self/ns/mnt"); now != own {
		t.Fatalf("the main thread is in mount namespace %s, not the process's %s", now, own)
	}
}

// A tree mount that is not below the trees' directory is refused before
// anything is done: the start namespace would not hold it.
func TestAMountOutsideTheTreesIsRefused(t *testing.T) {
	called := false
	err := startns.New("/run/trees").Run([]string{"/elsewhere/ws"}, nil, func() error { called = true; return nil })
	if !errors.Is(err, startns.ErrUnavailable) || called {
		t.Fatalf("err %v, called %v; want ErrUnavailable and no call", err, called)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A start that says what it needs from the host's mounts gets those
// alone: each bind with the mounts below it (through a link, the link's
// target), the mounts on the way to each path without what is mounted
// below them, /proc, /dev and /sys, and its tree; no other mount of the
// host.
func TestAStartNamespaceHoldsOnlyWhatItsStartNeeds(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	top := treesDir(t, dir)
	own := filepath.Join(top, "ann", "0", "workspace")
	mount(t, "", own)
	// The crowd: mounts no start needs.
	for i := range 20 {
		mount(t, "", filepath.Join(dir, "crowd", strconv.Itoa(i)))
	}
	src := filepath.Join(dir, "src")
	mount(t, "", src)
	mount(t, "", filepath.Join(src, "sub"))
	writeFile(t, filepath.Join(src, "sub", "mark"), "below a bind")
	linked := filepath.Join(dir, "linked")
	mount(t, "", linked)
	writeFile(t, filepath.Join(linked, "mark"), "a link's target")
	if err := os.Symlink(linked, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	// A link to a link on another mount, that mount needed by nothing
	// else: the kernel passes it again as bubblewrap binds.
	hop := filepath.Join(dir, "hop")
	mount(t, "", hop)
	if err := os.Symlink(linked, filepath.Join(hop, "next")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(hop, "next"), filepath.Join(dir, "link2")); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	mount(t, "", bin)
	writeFile(t, filepath.Join(bin, "tool"), "a binary")
	mount(t, "", filepath.Join(bin, "inner"))

	host := &startns.Host{Binds: []string{src, filepath.Join(dir, "link"), filepath.Join(dir, "link2"), filepath.Join(dir, "absent")}, Paths: []string{filepath.Join(bin, "tool")}}
	var table string
	marks := map[string]string{}
	err := startns.New(top).RunWith([]string{own}, host, nil, func() error {
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		table = string(b)
		for _, p := range []string{filepath.Join(src, "sub", "mark"), filepath.Join(dir, "link", "mark"), filepath.Join(dir, "link2", "mark"), filepath.Join(bin, "tool")} {
			m, _ := os.ReadFile(p)
			marks[p] = string(m)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	points := mountPoints(table)
	for _, p := range []string{own, src, filepath.Join(src, "sub"), linked, bin, "/proc", "/dev", "/sys"} {
		if !points[p] {
			t.Errorf("the start namespace has no mount at %s", p)
		}
	}
	for p, want := range map[string]string{filepath.Join(src, "sub", "mark"): "below a bind", filepath.Join(dir, "link", "mark"): "a link's target",
		filepath.Join(dir, "link2", "mark"): "a link's target", filepath.Join(bin, "tool"): "a binary"} {
		if marks[p] != want {
			t.Errorf("%s reads %q in the start namespace, want %q", p, marks[p], want)
		}
	}
	for p := range points {
		if strings.HasPrefix(p, filepath.Join(dir, "crowd")) || p == filepath.Join(bin, "inner") {
			t.Errorf("the start namespace has %s, which its start does not need", p)
		}
	}
	if t.Failed() {
		t.Logf("the start namespace's mounts:\n%s", table)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A magic link among what a start needs (a process's root, a descriptor's
// link in /proc) names no path the start can hold: the start namespace is
// unavailable, and nothing is called.
func TestAMagicLinkAmongTheNeedsIsRefused(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	for _, bind := range []string{"/proc/self/root" + src, "/proc/thread-self/cwd"} {
		called := false
		err := startns.New("").RunWith(nil, &startns.Host{Binds: []string{bind}}, nil, func() error { called = true; return nil })
		if !errors.Is(err, startns.ErrUnavailable) || called {
			t.Errorf("a bind of %s: err %v, called %v; want ErrUnavailable and no call", bind, err, called)
		}
	}
}
