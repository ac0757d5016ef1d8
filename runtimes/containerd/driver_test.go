//go:build e2e

package containerd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerdclient "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/runtimetest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The driver tests use a namespace of their own, so they never meet the
// controller suites' containers.
const testNamespace = "sandbox-controller-unit"

var (
	importOnce  sync.Once
	importErr   error
	importNames []string
)

// daemon returns a driver on the test daemon with the test image imported,
// or fails (CI) or skips (elsewhere) when there is none.
func daemon(t *testing.T, mutate func(*containerd.Config)) (*containerd.Runtime, string) {
	t.Helper()
	ce := testenv.ContainerdEnv(t, true)
	addr, tar := ce.Address, ce.ImageTar
	cfg := containerd.Config{Address: addr, Namespace: testNamespace, FIFODir: ce.FIFODir}
	if mutate != nil {
		mutate(&cfg)
	}
	rt, err := containerd.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	importOnce.Do(func() {
		f, err := os.Open(tar)
		if err != nil {
			importErr = err
			return
		}
		defer f.Close()
		importNames, importErr = rt.Import(context.Background(), f)
	})
	if runtimes.ReasonOf(importErr) == runtimes.ReasonUnavailable {
		testenv.Missing(t, "a running containerd at "+addr, testenv.ContainerdHowToStart)
	}
	if importErr != nil || len(importNames) == 0 {
		t.Fatalf("importing the test image %s: %v (names %q)", tar, importErr, importNames)
	}
	return rt, importNames[0]
}

// instance describes a containerd sandbox for agent, removed after the test.
func newInstance(t *testing.T, rt *containerd.Runtime, image, agent string, mutate func(*v1alpha1.SandboxSpec)) runtimes.Instance {
	t.Helper()
	spec := &v1alpha1.SandboxSpec{
		Agent:      agent,
		Backend:    v1alpha1.BackendContainerd,
		Binaries:   []v1alpha1.BinaryName{"sh", "cat", "sleep", "true"},
		Containerd: &v1alpha1.ContainerdSpec{Image: image},
	}
	if mutate != nil {
		mutate(spec)
	}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: areasRoot(t, agent)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Delete(context.Background(), in.Name); err != nil {
			t.Errorf("cleaning up %s: %v", in.Name, err)
		}
	})
	return in
}

var areasRoots sync.Map

// areasRoot is one areas root per agent for the whole test, so that
// describing the same agent again describes the same instance.
func areasRoot(t *testing.T, agent string) string {
	t.Helper()
	if dir, ok := areasRoots.Load(agent); ok {
		return dir.(string)
	}
	dir := filepath.Join(t.TempDir(), "areas")
	areasRoots.Store(agent, dir)
	t.Cleanup(func() { areasRoots.Delete(agent) })
	return dir
}

func ensure(t *testing.T, rt *containerd.Runtime, in runtimes.Instance) runtimes.State {
	t.Helper()
	st, err := rt.Ensure(context.Background(), in)
	if err != nil {
		t.Fatalf("Ensure %s: %v", in.Name, err)
	}
	return st
}

func inspect(t *testing.T, rt *containerd.Runtime, name string) runtimes.State {
	t.Helper()
	st, err := rt.Inspect(context.Background(), name)
	if err != nil {
		t.Fatalf("Inspect %s: %v", name, err)
	}
	return st
}

// run execs argv and returns its exit code and output.
func run(t *testing.T, rt *containerd.Runtime, name string, stdin string, argv ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	req := runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errOut}
	if stdin != "" {
		req.Stdin = strings.NewReader(stdin)
	}
	st, err := rt.Exec(context.Background(), name, req)
	if err != nil {
		t.Fatalf("Exec %q in %s: %v", argv, name, err)
	}
	return st.Code, out.String(), errOut.String()
}

func area(in runtimes.Instance, target string) string {
	for _, a := range in.Areas {
		if a.Target == target {
			return a.Source
		}
	}
	return ""
}

// giveTo hands the tree at root to the agent's host identity.
func giveTo(t *testing.T, in runtimes.Instance, root string) {
	t.Helper()
	if err := testenv.ChownTree(root, in.Identity.UID, in.Identity.GID); err != nil {
		t.Fatalf("giving %s to the agent: %v", root, err)
	}
}

// TestAgentRunsUnprivileged: commands run as the agent's own host identity,
// never root, without capabilities, with no_new_privs and containerd's
// default seccomp filter; what they write in the areas is the agent's on the
// host; an identity of 0 is refused before anything is made.
func TestAgentRunsUnprivileged(t *testing.T) {
	rt, image := daemon(t, nil)
	in := newInstance(t, rt, image, "unit-identity", nil)
	if in.Identity.UID == 0 {
		t.Fatalf("Describe gave the agent uid 0")
	}
	ensure(t, rt, in)
	code, out, stderr := run(t, rt, in.Name, "", "sh", "-c",
		`id -u; id -g; id -G; grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd):' /proc/self/status; echo x > /workspace/mine`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	id := strconv.FormatUint(uint64(in.Identity.UID), 10)
	want := []string{id, id, id, "Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000"}
	got := strings.Split(strings.TrimSpace(out), "\n")
	slices.Sort(want[3:])
	if len(got) > 3 {
		slices.Sort(got[3:])
	}
	if !slices.Equal(got, want) {
		t.Errorf("inside: %q, want %q", got, want)
	}
	fi, err := os.Lstat(filepath.Join(area(in, "/workspace"), "mine"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != in.Identity.UID || st.Gid != in.Identity.GID {
		t.Errorf("a file the agent wrote belongs to %d:%d on the host, want %d:%d", st.Uid, st.Gid, in.Identity.UID, in.Identity.GID)
	}

	root := in
	root.Name = "unit-identity-root"
	root.Identity = runtimes.Identity{}
	if _, err := rt.Ensure(context.Background(), root); runtimes.ReasonOf(err) != runtimes.ReasonRefused || !strings.Contains(err.Error(), "host root") {
		t.Errorf("Ensure with identity 0: %v, want %v naming host root", err, runtimes.ReasonRefused)
	}
	if st := inspect(t, rt, root.Name); st.Exists {
		t.Errorf("a container was made for identity 0: %+v", st)
	}
}

func TestLifecycleKeepsRootStateAndAreas(t *testing.T) {
	rt, image := daemon(t, nil)
	ctx := context.Background()
	in := newInstance(t, rt, image, "unit-life", nil)

	st := ensure(t, rt, in)
	if !st.Exists || !st.Running || st.Owner != in.Owner || st.ConfigHash != in.ConfigHash {
		t.Fatalf("after Ensure: %+v", st)
	}
	if st.Overlay == nil || !st.Overlay.Healthy {
		t.Errorf("overlay after Ensure: %+v", st.Overlay)
	}
	again := ensure(t, rt, in)
	if !again.CreatedAt.Equal(st.CreatedAt) || !again.Running {
		t.Errorf("a second Ensure changed the container: %+v then %+v", st, again)
	}

	code, out, _ := run(t, rt, in.Name, "", "sh", "-c", `echo from-sandbox > /workspace/out; pwd; echo "$HOME"; echo kept > /var/tmp/state; grep " /tmp " /proc/mounts`)
	if code != 0 {
		t.Fatalf("exit %d, output %q", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "/workspace" || lines[1] != "/workspace" || !strings.Contains(lines[2], "tmpfs") || !strings.Contains(lines[2], "size=65536k") {
		t.Errorf("cwd, HOME, /tmp = %q; want /workspace, /workspace and a 64 MiB tmpfs", lines)
	}
	hostFile := filepath.Join(area(in, "/workspace"), "out")
	if b, err := os.ReadFile(hostFile); err != nil || string(b) != "from-sandbox\n" {
		t.Errorf("host %s = %q, %v", hostFile, b, err)
	}
	if code, _, _ := run(t, rt, in.Name, "", "sh", "-c", "echo x > /blocks/x"); code == 0 {
		t.Error("a write into /blocks succeeded; blocks is read-only")
	}

	if err := rt.Stop(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, in.Name); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
	if st := inspect(t, rt, in.Name); !st.Exists || st.Running {
		t.Fatalf("after Stop: %+v", st)
	}
	if _, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"true"}}); runtimes.ReasonOf(err) != runtimes.ReasonNotFound {
		t.Errorf("Exec in a stopped container: %v, want %v", err, runtimes.ReasonNotFound)
	}
	ensure(t, rt, in)
	if _, out, _ := run(t, rt, in.Name, "", "cat", "/var/tmp/state"); out != "kept\n" {
		t.Errorf("/var/tmp/state after stop and start = %q, want kept", out)
	}

	if err := rt.Delete(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if st := inspect(t, rt, in.Name); st.Exists {
		t.Errorf("after Delete: %+v", st)
	}
	c, err := rt.Client()
	if err != nil {
		t.Fatal(err)
	}
	nsCtx := namespaces.WithNamespace(ctx, testNamespace)
	if _, err := c.SnapshotService(containerd.DefaultSnapshotter).Stat(nsCtx, in.Name); !errdefs.IsNotFound(err) {
		t.Errorf("snapshot %s after Delete: %v, want not found", in.Name, err)
	}
	if b, err := os.ReadFile(hostFile); err != nil || string(b) != "from-sandbox\n" {
		t.Errorf("the workspace lost %s after Delete: %q, %v", hostFile, b, err)
	}
	if err := rt.Delete(ctx, in.Name); err != nil {
		t.Errorf("a second Delete: %v", err)
	}
}

func TestExecStreamsAndRefuses(t *testing.T) {
	env := map[string]string{"TOKEN": "secret", "LANG": "C.UTF-8", "LEAK": "no"}
	rt, image := daemon(t, func(c *containerd.Config) {
		c.LookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	})
	in := newInstance(t, rt, image, "unit-exec", func(s *v1alpha1.SandboxSpec) {
		s.Env.Passthrough = []v1alpha1.EnvVarName{"TOKEN"}
	})
	ensure(t, rt, in)
	if err := os.WriteFile(filepath.Join(area(in, "/workspace"), policy.DotEnvFile), []byte("FROM_DOTENV=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name      string
		argv      []string
		stdin     string
		code      int
		out, errs string
	}{
		{name: "stdin is streamed to the command", argv: []string{"cat"}, stdin: "hello\nworld\n", out: "hello\nworld\n"},
		{name: "the exit code comes back", argv: []string{"sh", "-c", "exit 3"}, code: 3},
		{name: "stderr is kept apart", argv: []string{"sh", "-c", "echo out; echo err >&2"}, out: "out\n", errs: "err\n"},
		{name: "the environment is rebuilt by the policy", argv: []string{"sh", "-c", `echo "$TOKEN $FROM_DOTENV $PATH ${LEAK:-unset}"`},
			out: "secret yes " + policy.MinimalPath + " unset\n"},
		{name: "large output arrives whole", argv: []string{"sh", "-c", "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done | tail -n 1"}, out: "line-19999\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := run(t, rt, in.Name, tt.stdin, tt.argv...)
			if code != tt.code || out != tt.out || errs != tt.errs {
				t.Errorf("%q = %d, %q, %q; want %d, %q, %q", tt.argv, code, out, errs, tt.code, tt.out, tt.errs)
			}
		})
	}

	refused := []struct {
		name string
		req  runtimes.ExecRequest
	}{
		{name: "a command outside the allowlist", req: runtimes.ExecRequest{Argv: []string{"touch", "/workspace/refused"}}},
		{name: "a command with a shell metacharacter", req: runtimes.ExecRequest{Argv: []string{"sh;touch", "/workspace/refused"}}},
		{name: "a path instead of a name", req: runtimes.ExecRequest{Argv: []string{"/bin/touch", "/workspace/refused"}}},
		{name: "environment in the request", req: runtimes.ExecRequest{Argv: []string{"sh", "-c", "touch /workspace/refused"}, Env: []string{"X=1"}}},
		{name: "no command", req: runtimes.ExecRequest{}},
	}
	for _, tt := range refused {
		t.Run("refuses "+tt.name, func(t *testing.T) {
			_, err := rt.Exec(context.Background(), in.Name, tt.req)
			if runtimes.ReasonOf(err) != runtimes.ReasonRefused || !errors.Is(err, policy.ErrRefused) {
				t.Errorf("Exec %q: %v, want %v", tt.req.Argv, err, runtimes.ReasonRefused)
			}
			if _, err := os.Stat(filepath.Join(area(in, "/workspace"), "refused")); err == nil {
				t.Error("the refused command ran")
			}
		})
	}

	t.Run("cancelling the context kills the command", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The command's first output proves it runs; that is when to cancel.
		var canceledAt time.Time
		out := writerFunc(func(b []byte) (int, error) {
			if canceledAt.IsZero() {
				canceledAt = time.Now()
				cancel()
			}
			return len(b), nil
		})
		st, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", "echo started; exec sleep 30"}, Stdout: out})
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(canceledAt); took > 10*time.Second || st.Code != 128+9 {
			t.Errorf("sleep 30 cancelled: exit %d %s after the cancel, want 137 well before 30s", st.Code, took)
		}
		if _, out, _ := run(t, rt, in.Name, "", "sh", "-c", "ps -o comm | grep -c '^sleep$' || true"); strings.TrimSpace(out) != "1" {
			t.Errorf("sleep processes after the cancel (the init is one): %q", out)
		}
	})
}

func TestImageNotFoundIsNeverPulled(t *testing.T) {
	rt, _ := daemon(t, nil)
	in := newInstance(t, rt, "localhost/sandbox-controller/absent:1", "unit-noimage", nil)
	_, err := rt.Ensure(context.Background(), in)
	if runtimes.ReasonOf(err) != runtimes.ReasonImageNotFound {
		t.Fatalf("Ensure with an absent image: %v, want %v", err, runtimes.ReasonImageNotFound)
	}
	for _, want := range []string{"creating container " + in.Name, `"localhost/sandbox-controller/absent:1"`, `namespace "` + testNamespace + `"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if st := inspect(t, rt, in.Name); st.Exists {
		t.Errorf("a container was made anyway: %+v", st)
	}
}

func TestSpecChanges(t *testing.T) {
	rt, image := daemon(t, nil)
	base := func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"sh", "cat"} }
	in := newInstance(t, rt, image, "unit-change", base)
	ensure(t, rt, in)
	run(t, rt, in.Name, "", "sh", "-c", "echo kept > /var/tmp/state")

	// One container through every step: the steps are not subtests,
	// because each builds on the container the previous one left.
	{
		t.Log("a new allowlist applies without a restart")
		wider := newInstance(t, rt, image, "unit-change", func(s *v1alpha1.SandboxSpec) { base(s); s.Binaries = append(s.Binaries, "true") })
		before := inspect(t, rt, in.Name)
		st := ensure(t, rt, wider)
		if st.RestartRequired != "" || st.ConfigHash != wider.ConfigHash {
			t.Fatalf("after an allowlist change: %+v", st)
		}
		if code, _, _ := run(t, rt, in.Name, "", "true"); code != 0 {
			t.Errorf("the newly allowed command exited %d", code)
		}
		if after := inspect(t, rt, in.Name); !after.CreatedAt.Equal(before.CreatedAt) {
			t.Error("the container was recreated")
		}
		in = wider
	}
	{
		t.Log("a new mount waits for a restart and keeps the root")
		src := t.TempDir()
		if err := os.WriteFile(filepath.Join(src, "readme"), []byte("docs"), 0o644); err != nil {
			t.Fatal(err)
		}
		// The agent reads it as anyone would: t.TempDir is 0700.
		if err := os.Chmod(src, 0o755); err != nil {
			t.Fatal(err)
		}
		mounted := newInstance(t, rt, image, "unit-change", func(s *v1alpha1.SandboxSpec) {
			base(s)
			s.Binaries = append(s.Binaries, "true")
			s.Mounts = []v1alpha1.Mount{{Source: src, Target: "docs", Mode: v1alpha1.MountReadOnly}}
		})
		st := ensure(t, rt, mounted)
		if !st.Running || st.RestartRequired != "mounts" || st.ConfigHash != in.ConfigHash {
			t.Fatalf("a mount change on a running container: %+v, want RestartRequired mounts and the old hash", st)
		}
		if err := rt.Stop(context.Background(), in.Name); err != nil {
			t.Fatal(err)
		}
		if st := ensure(t, rt, mounted); st.RestartRequired != "" || st.ConfigHash != mounted.ConfigHash {
			t.Fatalf("after the restart: %+v", st)
		}
		if _, out, _ := run(t, rt, in.Name, "", "cat", "/workspace/docs/readme", "/var/tmp/state"); out != "docskept\n" {
			t.Errorf("mount and root state after the restart: %q", out)
		}
		if code, _, _ := run(t, rt, in.Name, "", "sh", "-c", "echo x > /workspace/docs/new"); code == 0 {
			t.Error("a write into a read-only mount succeeded")
		}
	}
}

func TestLimits(t *testing.T) {
	rt, image := daemon(t, nil)
	in := newInstance(t, rt, image, "unit-limits", func(s *v1alpha1.SandboxSpec) {
		s.Containerd.MemoryLimit = ptr.To(resource.MustParse("96Mi"))
		s.Containerd.PidsLimit = ptr.To[int64](40)
	})
	ensure(t, rt, in)
	pids, mem := cgroupFile("pids", in.Name, "pids.max"), cgroupFile("memory", in.Name, "memory.limit_in_bytes", "memory.max")
	if got := readTrim(t, pids); got != "40" {
		t.Errorf("%s = %q, want 40", pids, got)
	}
	if got := readTrim(t, mem); got != strconv.Itoa(96<<20) {
		t.Errorf("%s = %q, want %d", mem, got, 96<<20)
	}

	raised := newInstance(t, rt, image, "unit-limits", func(s *v1alpha1.SandboxSpec) {
		s.Containerd.MemoryLimit = ptr.To(resource.MustParse("96Mi"))
		s.Containerd.PidsLimit = ptr.To[int64](80)
	})
	if st := ensure(t, rt, raised); st.RestartRequired != "" {
		t.Fatalf("a pids limit change asked for a restart: %+v", st)
	}
	if got := readTrim(t, pids); got != "80" {
		t.Errorf("%s after a live change = %q, want 80", pids, got)
	}
}

// cgroupFile finds a task's cgroup file under the v1 controller hierarchy
// or the unified one.
func cgroupFile(controller, name string, files ...string) string {
	for _, dir := range []string{filepath.Join("/sys/fs/cgroup", controller, testNamespace, name), filepath.Join("/sys/fs/cgroup", testNamespace, name)} {
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
				return filepath.Join(dir, f)
			}
		}
	}
	return filepath.Join("/sys/fs/cgroup", controller, testNamespace, name, files[0])
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The writable layer is bounded, not only measured: 64 MiB cannot go into
// a container whose rootfsSizeLimit is 1 MiB, and the host's disk is not
// where the write lands.
func TestRootfsSizeLimitHolds(t *testing.T) {
	rt, image := daemon(t, nil)
	in := newInstance(t, rt, image, "unit-overlay", func(s *v1alpha1.SandboxSpec) {
		s.Containerd.RootfsSizeLimit = ptr.To(resource.MustParse("1Mi"))
	})
	ensure(t, rt, in)
	health := func() *runtimes.Health { return inspect(t, rt, in.Name).Overlay }
	if h := health(); h == nil || !h.Healthy || h.Reason != runtimes.ReasonHealthy || !strings.Contains(h.Message, "overlay") {
		t.Fatalf("fresh container: %+v", h)
	}
	code, out, _ := run(t, rt, in.Name, "", "sh", "-c", "head -c 67108864 /dev/zero > /var/tmp/big 2>/dev/null; echo $?; wc -c < /var/tmp/big")
	var rc, size int64
	if _, err := fmt.Sscan(out, &rc, &size); code != 0 || err != nil || rc == 0 || size > 1<<20 {
		t.Fatalf("64 MiB written into a 1 MiB rootfs: %q (want a failed write of at most 1 MiB)", out)
	}
	if h := health(); !h.Healthy || !strings.Contains(h.Message, "of 1Mi") {
		t.Errorf("after the failed write: %+v", h)
	}
	if code, _, _ := run(t, rt, in.Name, "", "sh", "-c", "rm /var/tmp/big && echo kept > /var/tmp/small"); code != 0 {
		t.Fatalf("removing the file: exit %d", code)
	}
	if err := rt.Stop(context.Background(), in.Name); err != nil {
		t.Fatal(err)
	}
	if h := health(); !h.Healthy || !strings.Contains(h.Message, "not mounted while the container is stopped") {
		t.Errorf("stopped container: %+v", h)
	}
	ensure(t, rt, in)
	if code, out, _ := run(t, rt, in.Name, "", "cat", "/var/tmp/small"); code != 0 || out != "kept\n" {
		t.Errorf("the writable layer after a restart: exit %d, %q", code, out)
	}
	if err := rt.Delete(context.Background(), in.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(in.AgentDir, ".rootfs.img")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the writable layer's image outlived its container: %v", err)
	}
}

func TestOwnership(t *testing.T) {
	rt, image := daemon(t, nil)
	ctx := context.Background()
	in := newInstance(t, rt, image, "unit-owned", nil)
	ensure(t, rt, in)

	other := in
	other.Owner = "elsewhere/alice"
	if _, err := rt.Ensure(ctx, other); runtimes.ReasonOf(err) != runtimes.ReasonNameConflict || !strings.Contains(err.Error(), in.Owner) {
		t.Errorf("Ensure by another owner: %v, want %v naming %v", err, runtimes.ReasonNameConflict, in.Owner)
	}

	c, err := rt.Client()
	if err != nil {
		t.Fatal(err)
	}
	nsCtx := namespaces.WithNamespace(ctx, testNamespace)
	img, err := c.GetImage(nsCtx, image)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := c.NewContainer(nsCtx, "unit-foreign", containerdclient.WithNewSnapshot("unit-foreign", img), containerdclient.WithNewSpec(oci.WithImageConfig(img)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = foreign.Delete(nsCtx, containerdclient.WithSnapshotCleanup) })

	states, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range states {
		names = append(names, st.Name)
		if st.Name == in.Name && (st.Owner != in.Owner || !st.Running) {
			t.Errorf("listed %+v", st)
		}
	}
	if !strings.Contains(strings.Join(names, " "), in.Name) || strings.Contains(strings.Join(names, " "), "unit-foreign") {
		t.Errorf("List = %q, want %s and not unit-foreign", names, in.Name)
	}
	if err := rt.Delete(ctx, "unit-foreign"); runtimes.ReasonOf(err) != runtimes.ReasonNameConflict {
		t.Errorf("Delete of a container without the owner label: %v, want %v", err, runtimes.ReasonNameConflict)
	}
}

func TestUnreachableDaemonIsUnavailable(t *testing.T) {
	rt, err := containerd.New(context.Background(), containerd.Config{Address: filepath.Join(t.TempDir(), "absent.sock")})
	if err != nil {
		t.Fatalf("New must not dial: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in := runtimes.Instance{Name: "cireilclaw-nobody", Owner: "ns/nobody", Image: "x", Containerd: &runtimes.ContainerdConfig{},
		AgentDir: filepath.Join(t.TempDir(), "nobody"), Areas: []runtimes.Bind{{Source: filepath.Join(t.TempDir(), "workspace"), Target: "/workspace"}},
		Identity: runtimes.Identity{UID: 2000000000, GID: 2000000000}}
	calls := map[string]func() error{
		"Ensure":  func() error { _, err := rt.Ensure(ctx, in); return err },
		"Inspect": func() error { _, err := rt.Inspect(ctx, in.Name); return err },
		"Stop":    func() error { return rt.Stop(ctx, in.Name) },
		"Delete":  func() error { return rt.Delete(ctx, in.Name) },
		"List":    func() error { _, err := rt.List(ctx); return err },
		"Exec": func() error {
			_, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"true"}})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); runtimes.ReasonOf(err) != runtimes.ReasonUnavailable {
				t.Errorf("%v with no daemon: %v, want %v", name, err, runtimes.ReasonUnavailable)
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestMissingSnapshotIsReportedAndMadeAnew(t *testing.T) {
	rt, image := daemon(t, nil)
	ctx := context.Background()
	in := newInstance(t, rt, image, "unit-snapshot", nil)
	ensure(t, rt, in)
	if err := rt.Stop(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	c, err := rt.Client()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SnapshotService(containerd.DefaultSnapshotter).Remove(namespaces.WithNamespace(ctx, testNamespace), in.Name); err != nil {
		t.Fatal(err)
	}
	if h := inspect(t, rt, in.Name).Overlay; h == nil || h.Healthy || h.Reason != runtimes.ReasonSnapshotMissing {
		t.Fatalf("overlay with its snapshot removed: %+v", h)
	}
	if st := ensure(t, rt, in); !st.Running || st.Overlay == nil || !st.Overlay.Healthy {
		t.Fatalf("Ensure after the snapshot went: %+v (overlay %+v)", st, st.Overlay)
	}
	if code, _, _ := run(t, rt, in.Name, "", "true"); code != 0 {
		t.Errorf("true exited %d in the remade root", code)
	}
}

func TestImageChangeToAnAbsentImageKeepsTheContainer(t *testing.T) {
	rt, image := daemon(t, nil)
	ctx := context.Background()
	in := newInstance(t, rt, image, "unit-reimage", nil)
	ensure(t, rt, in)
	run(t, rt, in.Name, "", "sh", "-c", "echo kept > /var/tmp/state")
	if err := rt.Stop(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	absent := newInstance(t, rt, image, "unit-reimage", func(s *v1alpha1.SandboxSpec) { s.Containerd.Image = "localhost/sandbox-controller/absent:2" })
	if _, err := rt.Ensure(ctx, absent); runtimes.ReasonOf(err) != runtimes.ReasonImageNotFound {
		t.Fatalf("Ensure with an absent new image: %v, want %v", err, runtimes.ReasonImageNotFound)
	}
	ensure(t, rt, in)
	if _, out, _ := run(t, rt, in.Name, "", "cat", "/var/tmp/state"); out != "kept\n" {
		t.Errorf("root state after a refused image change: %q", out)
	}
}

func TestGitDirBindsApplyLive(t *testing.T) {
	rt, image := daemon(t, nil)
	// A git directory where a worktree's .git file points, inside a
	// read-write mount, at a path the container's image does not have.
	projects := t.TempDir()
	gitDir := filepath.Join(projects, "repo with space", ".git")
	base := func(s *v1alpha1.SandboxSpec) {
		s.Binaries = []v1alpha1.BinaryName{"sh", "cat"}
		s.Mounts = []v1alpha1.Mount{{Source: projects, Target: "project", Mode: v1alpha1.MountReadWrite}}
	}
	in := newInstance(t, rt, image, "unit-gitdir", base)
	ensure(t, rt, in)
	run(t, rt, in.Name, "", "sh", "-c", "sleep 1000 >/dev/null 2>&1 &")
	pidOf := func() string {
		t.Helper()
		_, out, _ := run(t, rt, in.Name, "", "sh", "-c", "pidof sleep")
		return strings.TrimSpace(out)
	}
	before := pidOf()
	if before == "" {
		t.Fatal("no background process to tell a restart by")
	}

	if err := os.MkdirAll(gitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gitDir, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A read-write mount is the agent's, as its repositories would be.
	giveTo(t, in, projects)
	withGit := in
	withGit.Mounts = slices.Clone(in.Mounts)
	withGit.AddBinds(runtimes.Bind{Source: gitDir, Target: gitDir})

	st := ensure(t, rt, withGit)
	if st.RestartRequired != "" || st.ConfigHash != withGit.ConfigHash {
		t.Fatalf("adding a git directory bind to a running container: %+v, want it applied live", st)
	}
	if got := pidOf(); got != before {
		t.Fatalf("the container restarted (sleep was %s, now %q)", before, got)
	}
	if _, out, stderr := run(t, rt, in.Name, "", "cat", filepath.Join(gitDir, "HEAD")); out != "ref: refs/heads/main\n" {
		t.Fatalf("the git directory inside: %q %s", out, stderr)
	}
	if code, _, stderr := run(t, rt, in.Name, "", "sh", "-c", "echo from-inside > '"+gitDir+"/ORIG_HEAD'"); code != 0 {
		t.Fatalf("writing into the git directory inside: %s", stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(gitDir, "ORIG_HEAD")); string(b) != "from-inside\n" {
		t.Fatalf("the write inside did not reach the host: %q", b)
	}
	// Ensuring the same again changes nothing, and never stacks a second mount.
	ensure(t, rt, withGit)
	escaped := strings.ReplaceAll(gitDir, " ", `\040`)
	if _, out, _ := run(t, rt, in.Name, "", "sh", "-c", `grep -cF ' `+escaped+` ' /proc/self/mountinfo`); strings.TrimSpace(out) != "1" {
		t.Errorf("mounts at %s after a second Ensure: %s", gitDir, out)
	}

	t.Log("the bind goes when no claim needs it, still without a restart")
	if st := ensure(t, rt, in); st.RestartRequired != "" || st.ConfigHash != in.ConfigHash {
		t.Fatalf("removing the git directory bind: %+v", st)
	}
	if got := pidOf(); got != before {
		t.Fatalf("the container restarted on removal (sleep was %s, now %q)", before, got)
	}
	if code, _, _ := run(t, rt, in.Name, "", "cat", filepath.Join(gitDir, "HEAD")); code == 0 {
		t.Error("the git directory is still visible inside after its bind went")
	}
	if _, err := os.Stat(filepath.Join(gitDir, "ORIG_HEAD")); err != nil {
		t.Errorf("the host's git directory lost a file: %v", err)
	}

	t.Log("after a restart the record's binds are the ones mounted")
	ensure(t, rt, withGit)
	if err := rt.Stop(context.Background(), in.Name); err != nil {
		t.Fatal(err)
	}
	ensure(t, rt, withGit)
	if _, out, stderr := run(t, rt, in.Name, "", "cat", filepath.Join(gitDir, "HEAD")); out != "ref: refs/heads/main\n" {
		t.Fatalf("the git directory inside after a restart: %q %s", out, stderr)
	}

	t.Log("a .git replaced by a link out of the mount is not bound at the next start")
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.MkdirAll(secret, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "HEAD"), []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(context.Background(), in.Name); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gitDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, gitDir); err != nil {
		t.Fatal(err)
	}
	ensure(t, rt, withGit)
	if code, out, _ := run(t, rt, in.Name, "", "cat", filepath.Join(gitDir, "HEAD")); code == 0 || out == "host secret\n" {
		t.Fatalf("a link out of the mount was bound: exit %d, %q", code, out)
	}
}

func TestOverlayMount(t *testing.T) {
	rt, image := daemon(t, nil)
	src := runtimetest.OverlaySource(t)
	in := newInstance(t, rt, image, "unit-overlay", func(s *v1alpha1.SandboxSpec) {
		s.Binaries = []v1alpha1.BinaryName{"sh"}
		s.Mounts = []v1alpha1.Mount{{Source: src, Target: "project", Mode: v1alpha1.MountOverlay, SizeLimit: ptr.To(resource.MustParse("100Ki"))}}
	})
	runtimetest.OverlayMount(t, rt, in, src)
}

// A caller may give one writer for both outputs, as CombinedOutput does.
func TestExecIntoOneWriterForBothOutputs(t *testing.T) {
	rt, image := daemon(t, nil)
	in := newInstance(t, rt, image, "unit-combined", func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"sh"} })
	ensure(t, rt, in)
	for range 5 {
		var both bytes.Buffer
		st, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2"}, Stdout: &both, Stderr: &both})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec: %v, exit %d", err, st.Code)
		}
		if got := both.String(); !strings.Contains(got, "out\n") || !strings.Contains(got, "err\n") {
			t.Fatalf("combined output %q, want both lines", got)
		}
	}
}

// A container whose recorded spec still binds a custom mount by its path
// inside the workspace (as the driver did before mount trees) gets the
// driver's spec at its next start: no bind destination inside an area.
func TestStartReplacesASpecThatBindsInsideTheWorkspace(t *testing.T) {
	rt, image := daemon(t, nil)
	project := t.TempDir()
	in := newInstance(t, rt, image, "unit-oldspec", func(s *v1alpha1.SandboxSpec) {
		s.Mounts = []v1alpha1.Mount{{Source: project, Target: "project", Mode: v1alpha1.MountReadWrite}}
	})
	ensure(t, rt, in)
	if err := rt.Stop(context.Background(), in.Name); err != nil {
		t.Fatal(err)
	}
	c, err := rt.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	cont, err := c.LoadContainer(ctx, in.Name)
	if err != nil {
		t.Fatal(err)
	}
	old := specs.Mount{Destination: "/workspace/project", Type: "bind", Source: project, Options: []string{"rbind", "rw"}}
	if err := cont.Update(ctx, containerdclient.UpdateContainerOpts(func(ctx context.Context, _ *containerdclient.Client, rec *containers.Container) error {
		var s specs.Spec
		if err := json.Unmarshal(rec.Spec.GetValue(), &s); err != nil {
			return err
		}
		s.Mounts = append(s.Mounts, old)
		a, err := typeurl.MarshalAny(&s)
		rec.Spec = a
		return err
	})); err != nil {
		t.Fatal(err)
	}
	ensure(t, rt, in)
	s, err := cont.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		for _, a := range in.Areas {
			if strings.HasPrefix(m.Destination, a.Target+"/") {
				t.Fatalf("the started container's spec binds %s inside the area %s", m.Destination, a.Target)
			}
		}
	}
}

// The agent puts a link where a worktree's git directory is to be bound
// inside its container (below its own /tmp, where the worktrees' .git
// files point): the bind is left out, nothing is made or mounted where the
// link leads, and the rest of Ensure goes on.
func TestGitDirBindRefusesALinkOnItsTarget(t *testing.T) {
	rt, image := daemon(t, nil)
	projects := t.TempDir()
	gitDir := filepath.Join(projects, "app", ".git")
	if err := os.MkdirAll(gitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, rt, image, "unit-gitdir-link", func(s *v1alpha1.SandboxSpec) {
		s.Binaries = []v1alpha1.BinaryName{"sh", "cat", "ln", "mkdir", "grep"}
		s.Mounts = []v1alpha1.Mount{{Source: projects, Target: "project", Mode: v1alpha1.MountReadWrite}}
	})
	ensure(t, rt, in)
	giveTo(t, in, projects)
	parts := strings.Split(strings.Trim(gitDir, "/"), "/")
	if len(parts) < 3 {
		t.Fatalf("git directory %s is too short a path for the test", gitDir)
	}
	// The second component (below /tmp, say): the container's own, which
	// the agent may write.
	linked := "/" + parts[0] + "/" + parts[1]
	if code, _, stderr := run(t, rt, in.Name, "", "sh", "-c", "mkdir -p /workspace/decoy && ln -s /workspace/decoy '"+linked+"'"); code != 0 {
		t.Fatalf("planting the link: %s", stderr)
	}
	withGit := in
	withGit.Mounts = slices.Clone(in.Mounts)
	withGit.AddBinds(runtimes.Bind{Source: gitDir, Target: gitDir})
	if st := ensure(t, rt, withGit); st.RestartRequired != "" {
		t.Fatalf("adding the bind: %+v", st)
	}
	if _, out, _ := run(t, rt, in.Name, "", "sh", "-c", "grep -c ' /workspace/decoy' /proc/self/mountinfo"); strings.TrimSpace(out) != "0" {
		t.Fatalf("a mount landed where the agent's link leads: %s", out)
	}
	entries, err := os.ReadDir(filepath.Join(area(in, "/workspace"), "decoy"))
	if err != nil || len(entries) != 0 {
		t.Fatalf("directories were made where the link leads: %v %v", entries, err)
	}
}

// With the daemon's mount namespace named (as the DaemonSet's component
// does), trees are built and removed on a thread that joins the namespace
// of the process answering the socket: here the test's own, so the
// container runs as it does on the node, and nothing is left after Delete.
func TestTreesInTheDaemonsMountNamespace(t *testing.T) {
	rt, image := daemon(t, func(c *containerd.Config) { c.MountNamespace = containerd.DaemonMountNamespace })
	ctx := context.Background()
	in := newInstance(t, rt, image, "unit-daemonns", nil)
	if st := ensure(t, rt, in); !st.Running {
		t.Fatalf("after Ensure: %+v", st)
	}
	if code, out, errOut := run(t, rt, in.Name, "", "sh", "-c", "echo there > /workspace/out"); code != 0 {
		t.Fatalf("exit %d: %q %q", code, out, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(area(in, "/workspace"), "out")); err != nil || string(b) != "there\n" {
		t.Fatalf("the workspace on the host: %q, %v", b, err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mounts), "/"+in.Name+"/gens/") {
		t.Fatalf("no tree of %s in the daemon's mount namespace", in.Name)
	}
	if err := rt.Delete(ctx, in.Name); err != nil {
		t.Fatal(err)
	}
	if mounts, _ = os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), "/"+in.Name+"/gens/") {
		t.Fatalf("a tree of %s is left after Delete", in.Name)
	}
}

// A container's pids and memory limits hold, and what hit them is counted.
func TestLimitsHold(t *testing.T) {
	rt, image := daemon(t, nil)
	in := newInstance(t, rt, image, "unit-limits", func(s *v1alpha1.SandboxSpec) {
		s.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](runtimetest.LimitedPids),
			Limits: v1alpha1.ResourceAmounts{Memory: resource.NewQuantity(runtimetest.LimitedMemory, resource.BinarySI)}}
	})
	runtimetest.Limits(t, rt, in)
}

// TCP buffers count against a container's memory limit and in its usage:
// on cgroup v1, only once runc has given its cgroup a TCP limit.
func TestTCPBuffersCountAgainstTheMemoryLimit(t *testing.T) {
	rt, image := daemon(t, nil)
	in := newInstance(t, rt, image, "unit-tcp", func(s *v1alpha1.SandboxSpec) {
		s.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](512),
			Limits: v1alpha1.ResourceAmounts{Memory: resource.NewQuantity(runtimetest.TCPMemory, resource.BinarySI)}}
	})
	runtimetest.TCPBuffers(t, rt, in)
	// On v1, the container's cgroup (below its namespace's) says so.
	files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory/*", in.Name, "memory.kmem.tcp.limit_in_bytes"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(runtimetest.TCPMemory) {
			t.Fatalf("%s: %q %v; want %d", f, b, err, runtimetest.TCPMemory)
		}
	}
	t.Log("TCP limits read:", len(files))
}
