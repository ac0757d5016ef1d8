//go:build linux

package cgroup

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const (
	podUID   = "0b3c8a40-1c57-4e55-9f1e-3a6a3c6d2f10"
	otherUID = "7d2e41f8-5f0a-4c1e-8d55-0c7b9f3a1e22"
)

// tree makes the directories of paths below a new directory.
func tree(t *testing.T, paths ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// treeOwner owns the trees tests make, as root owns the kubelet's cgroups.
func treeOwner() uint32 { return uint32(os.Getuid()) }

// treePods finds Pods' cgroups in a tree a test made.
func treePods(root string) *Pods {
	p := NewPods(root)
	p.owner = treeOwner()
	return p
}

func TestFindPodUnderEitherKubeletDriver(t *testing.T) {
	systemdUID := strings.ReplaceAll(podUID, "-", "_")
	for _, c := range []struct {
		name string
		dirs []string
		want string
	}{
		{"cgroupfs, guaranteed", []string{"kubepods/pod" + otherUID, "kubepods/pod" + podUID + "/c1"}, "/kubepods/pod" + podUID},
		{"cgroupfs, burstable, below a --cgroup-root", []string{"system/x", "cluster/kubepods/burstable/pod" + podUID}, "/cluster/kubepods/burstable/pod" + podUID},
		{"cgroupfs, besteffort", []string{"kubepods/besteffort/pod" + podUID}, "/kubepods/besteffort/pod" + podUID},
		{"systemd, burstable", []string{"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + systemdUID + ".slice"},
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + systemdUID + ".slice"},
		{"systemd, guaranteed", []string{"kubepods.slice/kubepods-pod" + systemdUID + ".slice/cri-containerd-x.scope"},
			"/kubepods.slice/kubepods-pod" + systemdUID + ".slice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := findPod(tree(t, c.dirs...), podUID, treeOwner())
			if err != nil || got != c.want {
				t.Fatalf("findPod = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// A cgroup named like the Pod's anywhere the kubelet does not make Pods'
// cgroups is never taken: a container's cgroup is named after its
// instance, whose name an agent chooses, and the containerd backend's
// containers outside a Pod sit at /<namespace>/<instance>; inside another
// Pod's cgroup are that Pod's containers and instances. The search never
// enters them either.
func TestFindPodTakesOnlyTheKubeletsPlaces(t *testing.T) {
	for _, c := range []struct {
		name string
		dirs []string
	}{
		{"at the top", []string{"pod" + podUID}},
		{"in a container namespace", []string{"sandbox-controller/pod" + podUID, "kubepods/besteffort"}},
		{"inside another Pod", []string{"kubepods/pod" + otherUID + "/pod" + podUID}},
		{"inside another Pod's QoS-like child", []string{"kubepods/pod" + otherUID + "/burstable/pod" + podUID}},
		{"below a --cgroup-root's other children", []string{"cluster/system/pod" + podUID}},
		{"too deep", []string{"a/kubepods/burstable/kubepods-x/burstable/pod" + podUID}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := findPod(tree(t, c.dirs...), podUID, treeOwner())
			if !errors.Is(err, ErrPodNotFound) {
				t.Fatalf("findPod = %q, %v; want ErrPodNotFound", got, err)
			}
		})
	}
}

// An Incus container's root may make any cgroup in the one delegated to
// it (lxc.payload.<name>), kubepods/pod<uid> too, and the same is true of
// any cgroup given to another user: the search never enters them, so a
// Pod cgroup made there is never taken, whether the kubelet's is there,
// deeper, or not (yet). Were it taken, the instance's cgroup would be
// made inside the guest's tree, where the guest's root could freeze or
// kill the instance.
func TestFindPodNeverTakesAGuestsCgroup(t *testing.T) {
	id := strings.TrimPrefix(containerID, "containerd://")
	guest := "lxc.payload.evil/kubepods/pod" + podUID
	kubelets := "cluster/kubepods/burstable/pod" + podUID // deeper than the guest's
	for _, c := range []struct {
		name string
		dirs []string
		want string
	}{
		{"the guest's alone", []string{guest}, ""},
		{"the guest's and the kubelet's deeper", []string{guest, kubelets}, "/" + kubelets},
		{"the guest's below a QoS class", []string{"lxc.payload.evil/kubepods/burstable/pod" + podUID}, ""},
		{"the monitor's", []string{"lxc.monitor.evil/kubepods/pod" + podUID}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := findPod(tree(t, c.dirs...), podUID, treeOwner())
			if c.want == "" && !errors.Is(err, ErrPodNotFound) || c.want != "" && (err != nil || got != c.want) {
				t.Fatalf("findPod = %q, %v; want %q (ErrPodNotFound when empty)", got, err, c.want)
			}
			// On v1, with the container the kubelet reports.
			var v1 []string
			for _, d := range c.dirs {
				v1 = append(v1, d+"/"+id)
			}
			got, err = treePods(v1Tree(t, v1...)).Find(podUID, containerID)
			want := c.want
			if want != "" {
				want += "/" + id
			}
			if want == "" && !errors.Is(err, ErrPodNotFound) || want != "" && (err != nil || got != want) {
				t.Fatalf("Find on v1 = %q, %v; want %q (ErrPodNotFound when empty)", got, err, want)
			}
		})
	}
	t.Run("another user's cgroup", func(t *testing.T) {
		if os.Geteuid() != 0 {
			testenv.Missing(t, "root", "run the tests as root: the tree is given to another user")
		}
		root := tree(t, "delegated/kubepods/pod"+podUID, kubelets)
		if err := os.Chown(filepath.Join(root, "delegated"), 100000, 100000); err != nil {
			t.Fatal(err)
		}
		if got, err := findPod(root, podUID, treeOwner()); err != nil || got != "/"+kubelets {
			t.Fatalf("findPod = %q, %v; want %q", got, err, "/"+kubelets)
		}
	})
}

// Two cgroups of the Pod where the kubelet makes them are refused, not
// chosen between: one is not the kubelet's.
func TestFindPodRefusesTwoCgroupsOfThePod(t *testing.T) {
	got, err := findPod(tree(t, "kubepods/pod"+podUID, "cluster/kubepods/burstable/pod"+podUID), podUID, treeOwner())
	if err == nil || errors.Is(err, ErrPodNotFound) || !strings.Contains(err.Error(), "2 cgroups") {
		t.Fatalf("findPod = %q, %v; want an error saying the Pod has two cgroups", got, err)
	}
}

func TestFindRefusesWhatIsNotAPodUID(t *testing.T) {
	p := treePods(tree(t, "kubepods/pod..", "kubepods/pod"+podUID))
	for _, uid := range []string{"", "..", "../x", podUID + "/..", strings.ToUpper(podUID), podUID + "\n"} {
		if got, err := p.Find(uid, ""); err == nil {
			t.Errorf("Find(%q) = %q, want an error", uid, got)
		}
	}
}

// containerID is a container ID as the kubelet reports it.
const containerID = "containerd://4f0c3b1d2e5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0"

// v1Tree makes paths in each v1 hierarchy instances use.
func v1Tree(t *testing.T, paths ...string) string {
	t.Helper()
	var all []string
	for _, c := range v1Controllers {
		for _, p := range paths {
			all = append(all, filepath.Join(c, p))
		}
	}
	return tree(t, all...)
}

// On cgroup v1 an instance runs below the Pod's container, whose cgroup
// the kubelet reports for the Pod (kubectl top pod) and evicts by: named
// by its ID under the cgroupfs driver, a scope of the runtime under the
// systemd driver. Anything but a container ID as the kubelet gives it is
// refused, and a container not (yet) there is waited for.
func TestFindTakesThePodsContainer(t *testing.T) {
	id := strings.TrimPrefix(containerID, "containerd://")
	systemdPod := "kubepods.slice/kubepods-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice"
	for _, c := range []struct{ name, dir, want string }{
		{"cgroupfs", "kubepods/pod" + podUID + "/" + id, "/kubepods/pod" + podUID + "/" + id},
		{"systemd", systemdPod + "/cri-containerd-" + id + ".scope", "/" + systemdPod + "/cri-containerd-" + id + ".scope"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := treePods(v1Tree(t, c.dir)).Find(podUID, containerID)
			if err != nil || got != c.want {
				t.Fatalf("Find = %q, %v; want %q", got, err, c.want)
			}
		})
	}
	p := treePods(v1Tree(t, "kubepods/pod"+podUID+"/"+id, "kubepods/pod"+podUID+"/x"))
	for _, bad := range []string{"", "containerd://", "containerd://../x", "containerd://" + id + "/..", "x", id} {
		if got, err := p.Find(podUID, bad); !errors.Is(err, ErrPodNotFound) {
			t.Errorf("Find(%q) = %q, %v; want ErrPodNotFound", bad, got, err)
		}
	}
	other := "containerd://" + strings.Repeat("a", 64)
	if got, err := p.Find(podUID, other); !errors.Is(err, ErrPodNotFound) {
		t.Errorf("Find of a container not there = %q, %v; want ErrPodNotFound", got, err)
	}
}

// On the node's kubelets cgroups: an instance's cgroup is made right below a
// Pod's container's (v1) or the Pod's (v2), a command starts in it, the
// Pod's and the container's cgroups count what it uses (the kubelet reads
// them), and removing the instance leaves them, which are the kubelet's.
func TestInstanceRunsInThePodsCgroupAndLeavesIt(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "run the tests as root: Pods' cgroups are the kubelet's, made as root")
	}
	v2, err := isV2(Mount)
	if err != nil {
		testenv.Missing(t, "cgroups", err.Error())
	}
	// What a kubelet with --cgroup-root=<root> makes for a Guaranteed Pod
	// and its container.
	root := "/sandbox-controller-pod-test-" + strconv.Itoa(os.Getpid())
	podPath := root + "/kubepods/pod" + podUID
	parent := podPath // on v2: the Pod's
	if !v2 {
		parent = podPath + "/" + strings.TrimPrefix(containerID, "containerd://")
	}
	var made []string
	hierarchies := []string{""}
	if !v2 {
		hierarchies = v1Controllers
	}
	for _, c := range hierarchies {
		d := filepath.Join(Mount, c, parent)
		if err := os.MkdirAll(d, 0o755); err != nil {
			testenv.Missing(t, "a cgroup the test can make", err.Error())
		}
		made = append(made, filepath.Join(Mount, c, root))
	}
	t.Cleanup(func() {
		for _, top := range made {
			for _, d := range []string{filepath.Join(top, strings.TrimPrefix(parent, root)), filepath.Join(top, "kubepods/pod"+podUID), filepath.Join(top, "kubepods"), top} {
				_ = os.Remove(d)
			}
		}
	})
	if v2 {
		for d := Mount; ; {
			_ = enable(d)
			if d == filepath.Join(Mount, parent) {
				break
			}
			rel := strings.TrimPrefix(filepath.Join(Mount, parent), d+"/")
			d = filepath.Join(d, strings.SplitN(rel, "/", 2)[0])
		}
	}

	found, err := NewPods(Mount).Find(podUID, containerID)
	if err != nil || found != parent {
		t.Fatalf("Find = %q, %v; want %q", found, err, parent)
	}
	m, err := At(Mount, found)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure("inst", Limits{Pids: 64, MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	outFile := filepath.Join(t.TempDir(), "cgroup")
	out, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("sh", "-c", "cat /proc/self/cgroup; exec sleep 60")
	cmd.Stdout = out
	if err := m.Start("inst", cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := parent + "/inst"
	testenv.Eventually(t, 30*time.Second, "the command's cgroups to name "+want, func() bool {
		b, _ := os.ReadFile(outFile)
		return strings.Contains(string(b), want+"\n")
	})
	memory := "memory"
	if v2 {
		memory = ""
	}
	pids, err := os.ReadFile(filepath.Join(Mount, memory, parent, "inst", "cgroup.procs"))
	if err != nil || !strings.Contains(string(pids), strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("the instance's cgroup.procs = %q, %v; want pid %d", pids, err, cmd.Process.Pid)
	}
	// The Pod's and the container's cgroups count the instance's
	// processes, as the kubelet reads them.
	for _, p := range []string{podPath, parent} {
		u, err := readUsage(v2, m.swap, m.tcp, func(c string) string { return filepath.Join(Mount, c, p) })
		if err != nil {
			t.Fatal(err)
		}
		if u.Pids < 1 {
			t.Errorf("cgroup %s counts %d processes; the instance's are below it", p, u.Pids)
		}
	}
	if err := m.Remove("inst"); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, c := range hierarchies {
		if _, err := os.Stat(filepath.Join(Mount, c, parent)); err != nil {
			t.Errorf("removing the instance took the Pod's cgroup too: %v", err)
		}
		if _, err := os.Stat(filepath.Join(Mount, c, parent, "inst")); err == nil {
			t.Errorf("the instance's cgroup is still in %s", c)
		}
	}
}
