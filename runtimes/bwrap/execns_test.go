package bwrap_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/mountinfo"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// tellingDriver is a driver whose bubblewrap writes the mount table it
// starts with to table (testenv.TellingBwrap), and two running instances
// of it, ann's and bob's.
func tellingDriver(t *testing.T) (rt *bwrap.Runtime, ins []runtimes.Instance, state, dir, table string) {
	t.Helper()
	needTrees(t)
	dir = testenv.SharedDir(t)
	wrapper, table := testenv.TellingBwrap(t, dir)
	state = filepath.Join(dir, "state")
	var warnings bytes.Buffer
	rt, err := bwrap.New(bwrap.Config{StateDir: state, Bwrap: wrapper, Starter: testenv.Starter(t), Warnings: &warnings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bwrap.DetachTrees(state); err != nil {
			t.Error(err)
		}
		if warnings.Len() > 0 {
			t.Errorf("the driver warned: %s", warnings.String())
		}
	})
	for _, agent := range []string{"ann", "bob"} {
		in, err := instance.Standalone(&v1alpha1.SandboxSpec{Agent: agent, Binaries: []v1alpha1.BinaryName{"true"}}, instance.Host{AreasRoot: filepath.Join(dir, "areas"), Home: dir})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Ensure(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
		ins = append(ins, in)
	}
	return rt, ins, state, dir, table
}

// startTable runs true in instance name and returns the mount points
// its bubblewrap started with, as it wrote them to table.
func startTable(t *testing.T, rt *bwrap.Runtime, name, table string) []string {
	t.Helper()
	var stderr bytes.Buffer
	st, err := rt.Exec(context.Background(), name, runtimes.ExecRequest{Argv: []string{"true"}, Stderr: &stderr})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec: %v, exit %d: %s", err, st.Code, stderr.String())
	}
	b, err := os.ReadFile(table)
	if err != nil || len(b) == 0 {
		t.Fatalf("bubblewrap wrote no mount table: %v", err)
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 5 {
			points = append(points, mountinfo.Unescape(f[4]))
		}
	}
	return points
}

// bubblewrap copies the mount namespace it starts in and reads its whole
// mount table again for every read-only bind. Started in the host's
// namespace, every command paid for every instance's tree on the host
// (with 5,000 tree mounts, 170 ms a start instead of 6). A command now
// starts in a namespace holding its own instance's tree and no other:
// what bubblewrap sees as it starts is recorded by a bubblewrap that
// prints its mount table first.
func TestACommandStartsWithoutTheOtherInstancesTrees(t *testing.T) {
	rt, ins, state, _, table := tellingDriver(t)
	trees := bwrap.TreesDir(state)
	ann, bob := filepath.Join(trees, ins[0].Name), filepath.Join(trees, ins[1].Name)
	// Both trees are on the host.
	for _, tree := range []string{ann, bob} {
		if testenv.MountsBelow(t, tree) == 0 {
			t.Fatalf("no mount below %s on the host", tree)
		}
	}
	var own, others int
	for _, p := range startTable(t, rt, ins[0].Name, table) {
		switch {
		case strings.HasPrefix(p, ann+"/"):
			own++
		case p == filepath.Dir(trees):
			// The start namespace's own tmpfs holding ann's tree.
		case strings.HasPrefix(p, filepath.Dir(trees)+"/"):
			others++
			t.Errorf("bubblewrap started with %s mounted", p)
		}
	}
	if own == 0 {
		t.Fatal("bubblewrap started without ann's tree")
	}
	if others > 0 {
		t.Fatalf("bubblewrap started with %d mounts of trees other than ann's", others)
	}
}

// The host's other mounts (a node's pods' volumes and containers, the
// network namespaces, overlays and sized areas held for other instances
// outside their trees) are not in a command's start either: only what
// its bubblewrap binds and runs from, /proc, /dev and /sys.
func TestACommandStartsWithoutTheHostsOtherMounts(t *testing.T) {
	rt, ins, _, dir, table := tellingDriver(t)
	crowd := testenv.Crowd(t, filepath.Join(dir, "crowd"), 50)
	points := startTable(t, rt, ins[0].Name, table)
	var crowded int
	for _, p := range points {
		if strings.HasPrefix(p, crowd+"/") {
			crowded++
		}
	}
	if crowded > 0 {
		t.Errorf("bubblewrap started with %d of the host's 50 other mounts", crowded)
	}
	for _, want := range []string{"/proc", "/dev", "/sys"} {
		if !slices.Contains(points, want) {
			t.Errorf("bubblewrap started without %s: %q", want, points)
		}
	}
}

// A Pod's commands start in its cgroups, which are below where the node's
// hierarchies are mounted for the controller (a hostPath in its Pod, not
// /sys/fs/cgroup): the start, which opens them by path, has them too.
func TestAPodsCommandStartsInItsCgroupsWhereverTheyAreMounted(t *testing.T) {
	needTrees(t)
	dir := testenv.SharedDir(t)
	root := filepath.Join(dir, "host-cgroup")
	if err := testenv.MountAt(t, root, cgroup.Mount, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		testenv.Missing(t, "cgroups", err.Error())
	}
	// The Pod's cgroup, as its kubelet would have made it, in every
	// hierarchy (cgroup v1), or in the one (v2).
	pod := "/sandbox-controller-bwrap-pod-test-" + strconv.Itoa(os.Getpid())
	hierarchies := []string{root}
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		hierarchies, _ = filepath.Glob(filepath.Join(root, "*"))
	}
	for _, h := range hierarchies {
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(h, "cgroup.subtree_control"), []byte("+pids +memory +cpu"), 0)
		if err := os.Mkdir(filepath.Join(h, pod), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(h, pod, "cgroup.subtree_control"), []byte("+pids +memory +cpu"), 0)
		t.Cleanup(func() {
			entries, _ := os.ReadDir(filepath.Join(h, pod))
			for _, e := range entries {
				if e.IsDir() {
					_ = os.Remove(filepath.Join(h, pod, e.Name()))
				}
			}
			_ = os.Remove(filepath.Join(h, pod))
		})
	}

	state := filepath.Join(dir, "state")
	var warnings bytes.Buffer
	rt, err := bwrap.New(bwrap.Config{StateDir: state, Starter: testenv.Starter(t), Warnings: &warnings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bwrap.DetachTrees(state) })
	in, err := instance.Standalone(&v1alpha1.SandboxSpec{Agent: "ann", Binaries: []v1alpha1.BinaryName{"true"}}, instance.Host{AreasRoot: filepath.Join(dir, "areas"), Home: dir})
	if err != nil {
		t.Fatal(err)
	}
	in.Pod = &runtimes.Pod{UID: "0f814e06-e18c-4c73-b037-30c267e828e2", Cgroup: pod, CgroupRoot: root}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	var stderr bytes.Buffer
	st, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"true"}, Stderr: &stderr})
	if err != nil || st.Code != 0 {
		t.Fatalf("a command of a Pod's instance: %v, exit %d: %s", err, st.Code, stderr.String())
	}
	if warnings.Len() > 0 {
		t.Fatalf("the driver warned: %s", warnings.String())
	}
}

// bubblewrap reads its whole mount table again for every read-only bind,
// so each mount a start holds and nothing uses costs every command that
// many reads. Below /dev and /sys a host has mounts no start uses:
// --dev makes its own /dev/shm and /dev/pts, and of the cgroup
// hierarchies a start opens only those of the instance's cgroups. A
// start holds none of the others; a mount made here below /dev stands for
// what any host may have there.
func TestAStartHoldsNoMountBelowDevOrSysItDoesNotUse(t *testing.T) {
	rt, ins, _, _, table := tellingDriver(t)
	extra := filepath.Join("/dev", "sandbox-controller-test-"+strconv.Itoa(os.Getpid()))
	if err := testenv.MountAt(t, extra, "tmpfs", "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	// After the mount's own cleanup (cleanups run last first).
	t.Cleanup(func() { _ = os.Remove(extra) })
	points := startTable(t, rt, ins[0].Name, table)
	for _, p := range points {
		switch {
		case strings.HasPrefix(p, "/dev/"):
			t.Errorf("bubblewrap started with %s, which it does not use", p)
		case strings.HasPrefix(p, "/sys/") && !onTheWayToInstanceCgroups(t, p):
			t.Errorf("bubblewrap started with %s, which it does not use", p)
		}
	}
	for _, want := range []string{"/proc", "/dev", "/sys"} {
		if !slices.Contains(points, want) {
			t.Errorf("bubblewrap started without %s: %q", want, points)
		}
	}
}

// onTheWayToInstanceCgroups says whether mount point p (below /sys) is
// on the way to an instance's cgroups: the hierarchies' directory, or a
// hierarchy of a controller the driver limits (cgroup v1; a
// controller's name may be a link to a comounted hierarchy).
func onTheWayToInstanceCgroups(t *testing.T, p string) bool {
	t.Helper()
	if p == cgroup.Mount {
		return true
	}
	if filepath.Dir(p) != cgroup.Mount {
		return false
	}
	for _, c := range []string{"pids", "memory", "cpu", "cpuacct"} {
		real, err := filepath.EvalSymlinks(filepath.Join(cgroup.Mount, c))
		if err == nil && real == p {
			return true
		}
	}
	return false
}
