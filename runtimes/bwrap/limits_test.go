package bwrap_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// limited is a sandbox whose commands may have 64 processes and 128 MiB.
func limited(t *testing.T) *sandbox {
	t.Helper()
	return limitedStarting(t, "")
}

// limitedStarting is limited with the driver's cgroup v1 start.
func limitedStarting(t *testing.T, start string) *sandbox {
	t.Helper()
	testenv.Binary(t, "python3", "install python3")
	return newSandboxStarting(t, v1alpha1.SandboxSpec{
		Binaries: []v1alpha1.BinaryName{"sh", "python3", "cat", "sleep"},
		Resources: &v1alpha1.Resources{
			PidsLimit: ptr.To[int64](64),
			Limits:    v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("128Mi")), CPU: ptr.To(resource.MustParse("500m"))},
		},
	}, nil, bwrap.Host{}, start)
}

func usage(t *testing.T, s *sandbox) runtimes.Usage {
	t.Helper()
	u, err := s.rt.Usage(s.in.Name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A fork bomb stops at the pids limit, and the instance says it hit it.
func TestForkBombStopsAtThePidsLimit(t *testing.T) {
	s := limited(t)
	var out, errb bytes.Buffer
	_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{"python3", "-c", testenv.ForkBomb(1500, 30)}, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	made, perr := strconv.Atoi(strings.TrimSpace(out.String()))
	if perr != nil || made >= 64 {
		t.Fatalf("the command made %q processes (stderr %q); want fewer than the pids limit of 64", out.String(), errb.String())
	}
	if u := usage(t, s); u.PidsLimited == 0 {
		t.Fatalf("usage %+v: the refused forks are not counted", u)
	}
}

// A memory hog is killed at the memory limit, and the instance says so;
// the next command runs.
func TestMemoryHogIsKilledAtTheMemoryLimit(t *testing.T) {
	s := limited(t)
	code, out, stderr := s.exec(t, "python3", "-c", testenv.MemoryHog(1024))
	if code == 0 || strings.Contains(out, "touched 1024") {
		t.Fatalf("a 1 GiB allocation under a 128 MiB limit: exit %d stdout %q stderr %q", code, out, stderr)
	}
	if u := usage(t, s); u.OOMKills == 0 {
		t.Fatalf("usage %+v: the OOM kill is not counted (exit %d)", u, code)
	}
	if code, out, _ := s.exec(t, "sh", "-c", "echo alive"); code != 0 || out != "alive\n" {
		t.Fatalf("after the kill: exit %d %q", code, out)
	}
}

// TCP buffers count against the memory limit: on cgroup v1 the kernel
// charges a cgroup's sockets only where it has a TCP limit, and without
// one a command queued a gigabyte on loopback connections under a 128 MiB
// limit, memory of the host's (and host-wide TCP memory pressure) that
// no cgroup counted.
func TestTCPBuffersCountAgainstTheMemoryLimit(t *testing.T) {
	s := limited(t)
	code, out, stderr := s.exec(t, "python3", "-c", testenv.TCPHog(512, 0))
	var queued int
	if _, err := fmt.Sscanf(out, "queued %d", &queued); err != nil || code != 0 {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, stderr)
	}
	if queued >= 256 {
		t.Fatalf("a command queued %d MiB on TCP connections under a 128 MiB memory limit", queued)
	}
}

// The memory an instance uses counts its TCP buffers, which cgroup v1
// counts apart from the rest.
func TestUsageCountsTCPBuffers(t *testing.T) {
	s := limited(t)
	done := make(chan string)
	go func() {
		_, out, _ := s.exec(t, "python3", "-c", testenv.TCPHog(96, 3))
		done <- out
	}()
	var seen int64
	for deadline := time.Now().Add(3 * time.Second); seen < 96<<20 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		seen = max(seen, usage(t, s).MemoryBytes)
	}
	if out := <-done; seen < 96<<20 {
		t.Fatalf("a command holding 96 MiB on TCP connections (%q): the instance's usage said at most %d MiB", out, seen>>20)
	}
}

// Every process of a command is in the instance's cgroup from its start:
// the usage counts a command's processes while it runs.
// On cgroup v1 commands start as the driver was told, or, left to choose,
// as it measured to be faster on this host; each way, inside the
// instance's cgroup.
func TestCommandsRunInTheInstanceCgroup(t *testing.T) {
	for _, start := range []string{bwrap.StartAuto, bwrap.StartStarter, bwrap.StartMove} {
		t.Run(start, func(t *testing.T) {
			s := limitedStarting(t, start)
			how, costs := s.rt.CgroupV1Start()
			switch {
			case how == "":
				// cgroup v2: cloned into the cgroup, nothing to choose.
			case start != bwrap.StartAuto && (how != start || costs != nil):
				t.Errorf("told to start commands by %q, the driver starts them by %q (measured: %v)", start, how, costs)
			case start == bwrap.StartAuto && costs == nil:
				t.Errorf("left to choose, the driver starts commands by %q without measuring", how)
			case start == bwrap.StartAuto && (how == bwrap.StartMove) != costs.PreferMove():
				t.Errorf("left to choose, the driver starts commands by %q where %v", how, costs)
			}
			commandsRunInTheInstanceCgroup(t, s)
		})
	}
}

// A cgroup v1 start the driver does not know is refused, naming the
// setting and its values.
func TestAnUnknownCgroupV1StartIsRefused(t *testing.T) {
	_, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(t.TempDir(), "state"), CgroupV1Start: "fork"})
	if err == nil || !strings.Contains(err.Error(), "--bwrap-cgroup-v1-start") || !strings.Contains(err.Error(), "auto, starter or move") {
		t.Fatalf("an unknown cgroup v1 start: %v; want a refusal naming the setting and its values", err)
	}
}

func commandsRunInTheInstanceCgroup(t *testing.T, s *sandbox) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = s.exec(t, "sh", "-c", "sleep 3 & sleep 3 & sleep 3 & wait")
	}()
	var seen int64
	for deadline := time.Now().Add(3 * time.Second); seen < 4 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		seen = max(seen, usage(t, s).Pids)
	}
	<-done
	if seen < 4 {
		t.Fatalf("the instance's cgroup counted at most %d processes of a command running four", seen)
	}
}

// An instance whose cgroup went (a reboot, an administrator) gets it back
// on its next Ensure, with its limits, instead of every command failing.
func TestEnsureMakesALostCgroupAgain(t *testing.T) {
	s := limited(t)
	var removed int
	for _, c := range []string{"pids", "memory", "cpu", "cpuacct"} {
		_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup", c), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Name() == s.in.Name && strings.Contains(p, "sandbox-controller-bwrap-") {
				if os.Remove(p) == nil {
					removed++
				}
				return filepath.SkipDir
			}
			return nil
		})
	}
	if removed == 0 {
		t.Fatalf("found no cgroup of %s to remove", s.in.Name)
	}
	if _, err := s.rt.Usage(s.in.Name); err == nil {
		t.Fatal("the cgroup is still readable after its removal")
	}
	if _, err := s.rt.Ensure(context.Background(), s.in); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rt.Usage(s.in.Name); err != nil {
		t.Fatalf("after Ensure: %v", err)
	}
	if code, out, _ := s.exec(t, "sh", "-c", "echo ok"); code != 0 || out != "ok\n" {
		t.Fatalf("exit %d %q", code, out)
	}
}

// RemoveCgroups takes away the cgroups a stopped driver left for the
// next one to adopt.
func TestRemoveCgroupsTakesWhatADriverLeft(t *testing.T) {
	s := limited(t)
	count := func() int {
		n := 0
		for _, c := range []string{"pids", "memory", "cpu", "cpuacct", ""} {
			_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup", c), func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() && d.Name() == s.in.Name && strings.Contains(p, "sandbox-controller-bwrap-") {
					n++
					return filepath.SkipDir
				}
				return nil
			})
		}
		return n
	}
	if count() == 0 {
		t.Fatalf("no cgroup of %s", s.in.Name)
	}
	if err := bwrap.RemoveCgroups(filepath.Join(filepath.Dir(s.agentDir), "..", "state")); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d cgroups of %s left", n, s.in.Name)
	}
}
