package bwrap_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// decoyDir is a host directory outside every mount, holding a marker an
// escape would read and room an escape would write into.
func decoyDir(t *testing.T, parent string) string {
	t.Helper()
	d := filepath.Join(parent, "decoy")
	if err := os.MkdirAll(filepath.Join(d, "b", "src"), 0o777); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(d, "marker"), filepath.Join(d, "b", "src", "marker")} {
		if err := os.WriteFile(p, []byte("HOST\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// nestedMounts is a Sandbox with a read-write mount (team) and a second
// mount whose source lies inside the first: the agent can rename and
// replace every component of the second source's path below team.
func nestedMounts(t *testing.T, rel string) (s *sandbox, team, decoy string) {
	t.Helper()
	host := testenv.SharedDir(t)
	team = filepath.Join(host, "team")
	src := filepath.Join(team, rel)
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "marker"), []byte("MOUNT\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	decoy = decoyDir(t, host)
	s = newSandbox(t, v1alpha1.SandboxSpec{
		Binaries: []v1alpha1.BinaryName{"sh", "cat", "mv", "ln", "rm", "python3"},
		Mounts: []v1alpha1.Mount{
			{Source: team, Target: "team", Mode: v1alpha1.MountReadWrite},
			{Source: src, Target: "src", Mode: v1alpha1.MountReadWrite},
		},
	}, nil, bwrap.Host{})
	testenv.GiveTo(t, s.in.Identity.UID, team)
	return s, team, decoy
}

// readThroughFileAccess reads a sandbox path the way the file API does: a
// fresh view of the instance, acting as the agent.
func readThroughFileAccess(in runtimes.Instance, sandboxPath string) (string, error) {
	v, err := in.FileView()
	if err != nil {
		return "", err
	}
	r, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		return "", err
	}
	b, err := r.Read(rel)
	return string(b), err
}

// The review's third sequence: the agent replaces a component of another
// mount's source path with a link to a host directory; the next command's
// tree check sees a change and the rebuild used to bind the source by
// path, following the link. Now the source is resolved without links (an
// agent reaches it) from a held directory: nothing of the host appears,
// nothing is written there, and the file access refuses as well.
func TestRebuildNeverFollowsALinkSwappedIntoAMountSource(t *testing.T) {
	testenv.Binary(t, "python3", "install python3")
	for _, link := range []string{"abs", "rel"} {
		t.Run(link, func(t *testing.T) {
			s, _, decoy := nestedMounts(t, "a/b/src")
			target := decoy
			if link == "rel" {
				target = "../../decoy"
			}
			code, _, stderr := s.sh(t, fmt.Sprintf(`cd /workspace/team && mv a a.real && ln -s %s a`, target))
			if code != 0 {
				t.Fatalf("the agent's swap failed: exit %d %q", code, stderr)
			}
			var out, errb bytes.Buffer
			st, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{
				Argv:   []string{"sh", "-c", "cat /workspace/src/marker; echo pwned > /workspace/src/pwned"},
				Stdout: &out, Stderr: &errb})
			if strings.Contains(out.String(), "HOST") {
				t.Fatalf("the command read the host directory the link names: %q", out.String())
			}
			if _, serr := os.Stat(filepath.Join(decoy, "b", "src", "pwned")); serr == nil {
				t.Fatalf("the command wrote into the host directory the link names (exit %d, %v)", st.Code, err)
			}
			got, ferr := readThroughFileAccess(s.in, "/workspace/src/marker")
			if ferr == nil || strings.Contains(got, "HOST") {
				t.Fatalf("file access through the swapped source: %q %v; want a refusal", got, ferr)
			}
			// Put back, the mount is there again.
			code, _, stderr = s.sh(t, `cd /workspace/team && rm a && mv a.real a`)
			if code != 0 {
				t.Fatalf("restoring: exit %d %q", code, stderr)
			}
			code, o, stderr := s.sh(t, `cat /workspace/src/marker`)
			if code != 0 || o != "MOUNT\n" {
				t.Fatalf("after the agent restored its workspace: exit %d %q %q", code, o, stderr)
			}
		})
	}
}

// The review's second sequence: a mount source whose path goes through a
// link to /proc/<pid>/root, which a check of the path as text saw as a
// plain directory. No race is needed, so it must be refused every time:
// by Ensure, naming the magic link, and by the file access.
func TestMountSourceThroughAMagicLinkIsRefused(t *testing.T) {
	host := testenv.SharedDir(t)
	decoy := decoyDir(t, host)
	peek := filepath.Join(host, "peek")
	if err := os.Symlink("/proc/"+strconv.Itoa(os.Getpid())+"/root"+decoy, peek); err != nil {
		t.Fatal(err)
	}
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(host, "state")})
	if err != nil {
		t.Fatal(err)
	}
	spec := &v1alpha1.SandboxSpec{Agent: "pia", Binaries: []v1alpha1.BinaryName{"cat"},
		Mounts: []v1alpha1.Mount{{Source: peek, Target: "peek", Mode: v1alpha1.MountReadWrite}}}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(host, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	_, err = rt.Ensure(context.Background(), in)
	if runtimes.ReasonOf(err) != runtimes.ReasonMountSourceMissing || !strings.Contains(fmt.Sprint(err), "magic link") {
		t.Fatalf("Ensure with a source through /proc/<pid>/root: %v; want a refusal naming the magic link", err)
	}
	if got, err := readThroughFileAccess(in, "/workspace/peek/marker"); err == nil || strings.Contains(got, "HOST") {
		t.Fatalf("file access through the magic link: %q %v; want a refusal", got, err)
	}
}

// The review's first sequence as a race: agent processes exchange each
// component of a mount source's path below their workspace with links
// (absolute and relative, to a host directory holding the same names)
// by renameat2(RENAME_EXCHANGE) in a loop, while file accesses and command
// starts run. Not one of them reads the host directory.
func TestMountSourceComponentExchangeRace(t *testing.T) {
	testenv.Binary(t, "python3", "install python3")
	s, _, decoy := nestedMounts(t, "a/b/src")
	// At least 100,000 exchanges in all, more on a fast machine.
	const swaps = 200000
	// Each swapper exchanges one component with a link for its share of
	// the swaps and prints how many exchanges the kernel made.
	const swapper = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace/team")
while True:
    # The other swapper may have the directory out for a link right now.
    try:
        os.fchdir(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
        break
    except OSError:
        pass
name, n, done = sys.argv[2].encode(), int(sys.argv[3]), 0
links = []
for i, target in enumerate(sys.argv[4:]):
    l = ("l-%s-%d" % (sys.argv[2], i)).encode()
    os.symlink(target, l)
    links.append(l)
i = 0
while done < n:
    if libc.renameat2(-100, name, -100, links[i % len(links)], 2) == 0:
        done += 1
    i += 1
for l in links:
    if os.path.islink(l) is False:
        libc.renameat2(-100, name, -100, l, 2)
print(done)
`
	components := []struct{ dir, name, abs, rel string }{
		{".", "a", decoy, "../decoy"},
		{"a", "b", filepath.Join(decoy, "b"), "../../decoy/b"},
	}
	var swapped atomic.Int64
	var swappers sync.WaitGroup
	var swapperErrs sync.Map
	for _, c := range components {
		swappers.Add(1)
		go func() {
			defer swappers.Done()
			var out, errb bytes.Buffer
			st, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{
				Argv:   []string{"python3", "-c", swapper, c.dir, c.name, strconv.Itoa(swaps / len(components)), c.abs, c.rel},
				Stdout: &out, Stderr: &errb})
			n, perr := strconv.Atoi(strings.TrimSpace(out.String()))
			if err != nil || perr != nil {
				swapperErrs.Store(c.name, fmt.Sprintf("exit %d, %v, stdout %q, stderr %q", st.Code, err, out.String(), errb.String()))
				return
			}
			swapped.Add(int64(n))
		}()
	}
	stop := make(chan struct{})
	go func() { swappers.Wait(); close(stop) }()
	var reads, starts, escapes atomic.Int64
	var workers sync.WaitGroup
	running := func() bool {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	for range 2 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for running() {
				got, _ := readThroughFileAccess(s.in, "/workspace/src/marker")
				reads.Add(1)
				if strings.Contains(got, "HOST") {
					escapes.Add(1)
				}
			}
		}()
	}
	workers.Add(1)
	go func() {
		defer workers.Done()
		for running() {
			var out bytes.Buffer
			_, _ = s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{
				Argv: []string{"cat", "/workspace/src/marker"}, Stdout: &out, Stderr: &bytes.Buffer{}})
			starts.Add(1)
			if strings.Contains(out.String(), "HOST") {
				escapes.Add(1)
			}
		}
	}()
	workers.Wait()
	t.Logf("%d exchanges, %d file accesses, %d command starts, %d escapes", swapped.Load(), reads.Load(), starts.Load(), escapes.Load())
	if escapes.Load() != 0 {
		t.Fatalf("%d accesses read the host directory through a swapped mount source component", escapes.Load())
	}
	swapperErrs.Range(func(k, v any) bool {
		t.Logf("the swapper of component %v ended early: %v", k, v)
		return true
	})
	if swapped.Load() < swaps || reads.Load() == 0 || starts.Load() == 0 {
		t.Fatalf("the race did not run: %d of %d exchanges, %d file accesses, %d command starts", swapped.Load(), swaps, reads.Load(), starts.Load())
	}
}
