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
			got, err := findPod(tree(t, c.dirs...), podUID)
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
			got, err := findPod(tree(t, c.dirs...), podUID)
			if !errors.Is(err, ErrPodNotFound) {
				t.Fatalf("findPod = %q, %v; want ErrPodNotFound", got, err)
			}
		})
	}
}

func TestFindRefusesWhatIsNotAPodUID(t *testing.T) {
	p := NewPods(tree(t, "kubepods/pod..", "kubepods/pod"+podUID))
	for _, uid := range []string{"", "..", "../x", podUID + "/..", strings.ToUpper(podUID), podUID + "\n"} {
		if got, err := p.Find(uid); err == nil {
			t.Errorf("Find(%q) = %q, want an error", uid, got)
		}
	}
}

// On the node's real cgroups: an instance's cgroup is made right below a
// Pod's, a command starts in it, the Pod's cgroup counts what it uses
// (the kubelet reads the Pod's), and removing the instance leaves the
// Pod's cgroup, which is the kubelet's.
func TestInstanceRunsInThePodsCgroupAndLeavesIt(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "run the tests as root: Pods' cgroups are the kubelet's, made as root")
	}
	v2, err := isV2(Mount)
	if err != nil {
		testenv.Missing(t, "cgroups", err.Error())
	}
	// What a kubelet with --cgroup-root=<root> makes for a Guaranteed Pod.
	root := "/sandbox-controller-pod-test-" + strconv.Itoa(os.Getpid())
	podPath := root + "/kubepods/pod" + podUID
	var made []string
	hierarchies := []string{""}
	if !v2 {
		hierarchies = v1Controllers
	}
	for _, c := range hierarchies {
		d := filepath.Join(Mount, c, podPath)
		if err := os.MkdirAll(d, 0o755); err != nil {
			testenv.Missing(t, "a cgroup the test can make", err.Error())
		}
		made = append(made, filepath.Join(Mount, c, root))
	}
	t.Cleanup(func() {
		for _, top := range made {
			for _, d := range []string{filepath.Join(top, "kubepods/pod"+podUID), filepath.Join(top, "kubepods"), top} {
				_ = os.Remove(d)
			}
		}
	})
	if v2 {
		for d := Mount; ; {
			_ = enable(d)
			if d == filepath.Join(Mount, podPath) {
				break
			}
			rel := strings.TrimPrefix(filepath.Join(Mount, podPath), d+"/")
			d = filepath.Join(d, strings.SplitN(rel, "/", 2)[0])
		}
	}

	found, err := NewPods(Mount).Find(podUID)
	if err != nil || found != podPath {
		t.Fatalf("Find = %q, %v; want %q", found, err, podPath)
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
	want := podPath + "/inst"
	testenv.Eventually(t, 30*time.Second, "the command's cgroups to name "+want, func() bool {
		b, _ := os.ReadFile(outFile)
		return strings.Contains(string(b), want+"\n")
	})
	memory := "memory"
	if v2 {
		memory = ""
	}
	pids, err := os.ReadFile(filepath.Join(Mount, memory, podPath, "inst", "cgroup.procs"))
	if err != nil || !strings.Contains(string(pids), strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("the instance's cgroup.procs = %q, %v; want pid %d", pids, err, cmd.Process.Pid)
	}
	// The Pod's cgroup counts the instance's processes, as the kubelet
	// reads it.
	podUsage, err := readUsage(v2, func(c string) string { return filepath.Join(Mount, c, podPath) })
	if err != nil {
		t.Fatal(err)
	}
	if podUsage.Pids < 1 {
		t.Errorf("the Pod's cgroup counts %d processes; the instance's are below it", podUsage.Pids)
	}
	if err := m.Remove("inst"); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, c := range hierarchies {
		if _, err := os.Stat(filepath.Join(Mount, c, podPath)); err != nil {
			t.Errorf("removing the instance took the Pod's cgroup too: %v", err)
		}
		if _, err := os.Stat(filepath.Join(Mount, c, podPath, "inst")); err == nil {
			t.Errorf("the instance's cgroup is still in %s", c)
		}
	}
}
