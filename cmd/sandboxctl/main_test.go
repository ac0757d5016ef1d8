package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func needBwrap(t *testing.T) {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh); in CI a missing bwrap fails this test")
}

func writeConfig(t *testing.T, dir, content string) string {
	t.Helper()
	p := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sandboxctl(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestRun(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	areas := filepath.Join(dir, "areas")
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\", \"cat\"]\n")
	base := []string{"run", "--config", cfg, "--agent", "ada", "--areas-root", areas, "--"}

	t.Run("run/exit code, stdout and stderr are the command's", func(t *testing.T) {
		code, out, stderr := sandboxctl(t, "", append(base, "sh", "-c", "echo out; echo err >&2; exit 7")...)
		if code != 7 || out != "out\n" || stderr != "err\n" {
			t.Fatalf("exit %d stdout %q stderr %q", code, out, stderr)
		}
	})
	t.Run("run/stdin is the command's", func(t *testing.T) {
		code, out, _ := sandboxctl(t, "from stdin", append(base, "cat")...)
		if code != 0 || out != "from stdin" {
			t.Fatalf("exit %d stdout %q", code, out)
		}
	})
	t.Run("run/areas are created when missing", func(t *testing.T) {
		for _, a := range []string{"workspace", "memories", "blocks", "skills", "tasks"} {
			if fi, err := os.Stat(filepath.Join(areas, "ada", a)); err != nil || !fi.IsDir() {
				t.Fatalf("area %s: %v", a, err)
			}
		}
	})
	t.Run("run/refused command runs nothing and exits 126 with the reason", func(t *testing.T) {
		code, out, stderr := sandboxctl(t, "", append(base, "touch", "/workspace/ran")...)
		if code != exitRefused || out != "" || !strings.Contains(stderr, "not in the sandbox's binaries allowlist") {
			t.Fatalf("exit %d stdout %q stderr %q", code, out, stderr)
		}
		code, _, stderr = sandboxctl(t, "", append(base, "sh;touch", "/workspace/ran")...)
		if code != exitRefused || !strings.Contains(stderr, `shell metacharacter ';'`) {
			t.Fatalf("exit %d stderr %q", code, stderr)
		}
		if _, err := os.Stat(filepath.Join(areas, "ada", "workspace", "ran")); !os.IsNotExist(err) {
			t.Fatalf("a refused command ran: %v", err)
		}
	})
	t.Run("run/invalid configuration runs nothing and says where", func(t *testing.T) {
		bad := writeConfig(t, t.TempDir(), "[bwrap]\nbinaries = [\"sh\"]\nshell = true\n")
		code, _, stderr := sandboxctl(t, "", "run", "--config", bad, "--agent", "ada", "--areas-root", areas, "--", "sh", "-c", "true")
		if code != exitFailed || !strings.Contains(stderr, "sandbox.toml:3:1: bwrap.shell: unknown key") {
			t.Fatalf("exit %d stderr %q", code, stderr)
		}
	})
	t.Run("run/missing configuration is the default: nothing allowed", func(t *testing.T) {
		code, _, stderr := sandboxctl(t, "", "run", "--config", filepath.Join(dir, "absent.toml"), "--agent", "ada", "--areas-root", areas, "--", "sh", "-c", "true")
		if code != exitRefused || !strings.Contains(stderr, "allowlist []") {
			t.Fatalf("exit %d stderr %q", code, stderr)
		}
	})
	t.Run("run/usage errors", func(t *testing.T) {
		if code, _, stderr := sandboxctl(t, "", "run", "--config", cfg, "--", "sh"); code != exitUsage || !strings.Contains(stderr, "--agent") {
			t.Fatalf("no agent: exit %d stderr %q", code, stderr)
		}
		if code, _, _ := sandboxctl(t, ""); code != exitUsage {
			t.Fatalf("no command: exit %d", code)
		}
		if code, out, _ := sandboxctl(t, "", "help"); code != 0 || !strings.Contains(out, "sandboxctl run") {
			t.Fatalf("help: exit %d", code)
		}
	})
}

func TestConvert(t *testing.T) {
	code, out, stderr := sandboxctl(t, "", "convert", filepath.Join("..", "..", "config", "sandbox.toml"), "--agent", "ada", "--namespace", "agents")
	if code != 0 {
		t.Fatalf("exit %d stderr %q", code, stderr)
	}
	var sb v1alpha1.Sandbox
	if err := yaml.UnmarshalStrict([]byte(out), &sb); err != nil {
		t.Fatalf("not a Sandbox manifest: %v\n%s", err, out)
	}
	if sb.Kind != "Sandbox" || sb.Name != "ada" || sb.Namespace != "agents" || sb.Spec.Agent != "ada" || len(sb.Spec.Binaries) != 2 {
		t.Fatalf("manifest:\n%s", out)
	}
	if code, _, stderr := sandboxctl(t, "", "convert", "--agent", "ada"); code != exitUsage || !strings.Contains(stderr, "FILE") {
		t.Fatalf("convert without a file: exit %d stderr %q", code, stderr)
	}
}

// lockedBuffer is a bytes.Buffer that serve's watcher goroutine writes
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lineReader reads serve's responses, one JSON line each.
type lineReader struct{ r *bufio.Reader }

func (l lineReader) next(t *testing.T) response {
	t.Helper()
	line, err := l.r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading a response: %v", err)
	}
	var resp response
	if err := json.Unmarshal([]byte(line), &resp); err != nil {
		t.Fatalf("response %q: %v", line, err)
	}
	return resp
}

// served is a sandboxctl serve running in this process.
type served struct {
	in        *io.PipeWriter
	done      chan int
	stderr    *lockedBuffer
	responses lineReader
}

func (s *served) send(line string) { _, _ = io.WriteString(s.in, line+"\n") }

// stop ends serve's input and wants it to exit 0.
func (s *served) stop(t *testing.T) {
	t.Helper()
	s.in.Close()
	if code := <-s.done; code != 0 {
		t.Fatalf("serve exited %d; stderr %q", code, s.stderr.String())
	}
}

// startServe runs sandboxctl serve of agent ada with the configuration
// cfg and the areas root areas.
func startServe(t *testing.T, cfg, areas string) *served {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &served{in: inW, done: make(chan int, 1), stderr: &lockedBuffer{}, responses: lineReader{bufio.NewReader(outR)}}
	go func() {
		s.done <- run([]string{"serve", "--config", cfg, "--agent", "ada", "--areas-root", areas}, inR, outW, s.stderr)
		outW.Close()
	}()
	return s
}

func TestServeReloads(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\"]\n")
	sv := startServe(t, cfg, filepath.Join(dir, "areas"))
	responses, send, stderr := sv.responses, sv.send, sv.stderr

	send(`["sh","-c","echo hi; exit 3"]`)
	if r := responses.next(t); r.Exit != 3 || r.Stdout != "hi\n" || r.Error != "" {
		t.Fatalf("first command: %+v", r)
	}
	send(`["cat","/etc/hostname"]`)
	if r := responses.next(t); !r.Refused || r.Exit != exitRefused {
		t.Fatalf("cat before the reload: %+v", r)
	}
	send(`not json`)
	if r := responses.next(t); r.Error == "" || r.Exit != exitUsage {
		t.Fatalf("malformed request: %+v", r)
	}

	tmp := cfg + ".new"
	if err := os.WriteFile(tmp, []byte("[bwrap]\nbinaries = [\"sh\", \"cat\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cfg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		send(`["cat","/proc/self/comm"]`)
		r := responses.next(t)
		if r.Error == "" && r.Stdout == "cat\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reload never reached a command: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := os.WriteFile(cfg, []byte("[bwrap]\nbinaries = [\"sh\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(stderr.String(), "keeping the last good configuration") {
		if time.Now().After(deadline) {
			t.Fatalf("the invalid edit was not reported; stderr %q", stderr.String())
		}
		send(`["cat","/proc/self/comm"]`)
		if r := responses.next(t); r.Stdout != "cat\n" {
			t.Fatalf("after an invalid edit the last good configuration must stay: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sv.stop(t)
}

// The seed's bypass runs the command on the host, as the runtime: with the
// default layout (areas below a directory only the runtime may search) the
// agent's own id could not even reach its workspace, and the warning says
// whose identity the command has.
func TestRunWithTheSandboxDisabled(t *testing.T) {
	needBwrap(t)
	t.Setenv(policy.DisableSandboxEnv, "i-am-in-a-container")
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	areas := filepath.Join(dir, "areas")
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\"]\n")
	code, out, stderr := sandboxctl(t, "", "run", "--config", cfg, "--agent", "ada", "--areas-root", areas, "--", "sh", "-c", "pwd; echo $(id -u) > uid; cat uid")
	if code != 0 {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, stderr)
	}
	want := fmt.Sprintf("%s\n%d\n", filepath.Join(areas, "ada", "workspace"), os.Geteuid())
	if out != want {
		t.Fatalf("stdout %q, want the host workspace and the runtime's uid %q", out, want)
	}
	if !strings.Contains(stderr, "SANDBOX IS DISABLED") || !strings.Contains(stderr, fmt.Sprintf("uid %d, gid %d", os.Geteuid(), os.Getegid())) {
		t.Fatalf("the warning does not say whose identity the command has: %q", stderr)
	}
}

// An agent that puts a link on the way to a mount's destination leaves a
// standalone sandbox that cannot be built: run says so and names the way
// out, repair moves the link aside (deleting nothing) and the next
// command runs with the mount in place.
func TestRepairAfterALinkOnAMountDestination(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "marker"), []byte("MOUNT\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	areas := filepath.Join(dir, "areas")
	cfg := writeConfig(t, dir, fmt.Sprintf("mounts = [{source = %q, target = \"a/b\", mode = \"ro\"}]\n[bwrap]\nbinaries = [\"sh\", \"ln\", \"mv\", \"cat\"]\n", src))
	flags := []string{"--config", cfg, "--agent", "zed", "--areas-root", areas}
	runIn := func(script string) (int, string, string) {
		return sandboxctl(t, "", append(append([]string{"run"}, flags...), "--", "sh", "-c", script)...)
	}
	if code, out, stderr := runIn(`mv /workspace/a /workspace/a.moved && ln -s /etc /workspace/a`); code != 0 {
		t.Fatalf("the agent's link: exit %d %q %q", code, out, stderr)
	}
	code, _, stderr := runIn(`cat /workspace/a/b/marker`)
	if code != exitFailed || !strings.Contains(stderr, "/workspace/a/b") || !strings.Contains(stderr, "sandboxctl repair --config "+cfg+" --agent zed") {
		t.Fatalf("with the link: exit %d stderr %q; want a failure naming the destination and the repair", code, stderr)
	}
	code, out, stderr := sandboxctl(t, "", append([]string{"repair"}, flags...)...)
	if code != 0 || !strings.Contains(out, "moved /workspace/a aside to a.blocked-") {
		t.Fatalf("repair: exit %d stdout %q stderr %q", code, out, stderr)
	}
	code, out, stderr = runIn(`cat /workspace/a/b/marker`)
	if code != 0 || out != "MOUNT\n" {
		t.Fatalf("after the repair: exit %d stdout %q stderr %q", code, out, stderr)
	}
	entries, err := os.ReadDir(filepath.Join(areas, "zed", "workspace"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, e := range entries {
		kept = append(kept, e.Name())
	}
	if !slices.ContainsFunc(kept, func(n string) bool { return strings.HasPrefix(n, "a.blocked-") }) || !slices.Contains(kept, "a.moved") {
		t.Fatalf("the workspace holds %v; the link and the agent's directory must both be kept", kept)
	}
}

// [limits] bounds what a standalone sandbox's commands use: with pids =
// 256 and memory = "256Mi", a command can neither fork 1,500 processes
// nor touch 1 GiB; convert carries the table over as spec.resources.
func TestRunHoldsTheLimitsTable(t *testing.T) {
	needBwrap(t)
	testenv.Binary(t, "python3", "install python3")
	dir := t.TempDir()
	areas := filepath.Join(dir, "areas")
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"python3\"]\n[limits]\npids = 256\nmemory = \"256Mi\"\ncpu = \"1\"\n")
	base := []string{"run", "--config", cfg, "--agent", "lim", "--areas-root", areas, "--", "python3", "-c"}
	code, out, stderr := sandboxctl(t, "", append(base, testenv.ForkBomb(1500, 20))...)

	made, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || made >= 256 {
		t.Fatalf("fork bomb under pids = 256: exit %d stdout %q stderr %q", code, out, stderr)
	}
	code, out, stderr = sandboxctl(t, "", append(base, testenv.MemoryHog(1024))...)

	if code == 0 || strings.Contains(out, "touched 1024") {
		t.Fatalf("1 GiB under memory = 256Mi: exit %d stdout %q stderr %q", code, out, stderr)
	}
	code, out, stderr = sandboxctl(t, "", "convert", cfg, "--agent", "lim")
	if code != 0 || !strings.Contains(out, "pidsLimit: 256") || !strings.Contains(out, "memory: 256Mi") || !strings.Contains(out, `cpu: "1"`) {
		t.Fatalf("convert: exit %d stdout %q stderr %q; want spec.resources with the limits", code, out, stderr)
	}
	bad := writeConfig(t, t.TempDir(), "[limits]\nmemory = \"lots\"\n")
	code, _, stderr = sandboxctl(t, "", "run", "--config", bad, "--agent", "lim", "--areas-root", areas, "--", "python3", "-c", "1")
	if code != exitFailed || !strings.Contains(stderr, "limits.memory") {
		t.Fatalf("a bad [limits] memory: exit %d stderr %q; want the key named", code, stderr)
	}
}

// A [network] allowlist gets a namespace and a proxy for the run: the
// command finds the proxy in HTTPS_PROXY, the proxy refuses an internal
// address although it is listed (no class allows one here), a direct
// connection reaches nothing, and the namespace goes when the run ends.
func TestRunWithAnEgressAllowlist(t *testing.T) {
	needBwrap(t)
	testenv.Binary(t, "python3", "install python3")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need root: run the tests as root (CI does)")
	}
	l, err := net.Listen("tcp4", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "reached") }), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	areas := filepath.Join(dir, "areas")
	cfg := writeConfig(t, dir, fmt.Sprintf("[bwrap]\nbinaries = [\"python3\"]\n[network]\negress = \"Allowlist\"\n[[network.allow]]\nhost = \"127.0.0.2\"\nports = [%d]\n", port))
	probe := fmt.Sprintf(`
import os, socket, urllib.request, urllib.error
print("proxy", os.environ.get("HTTPS_PROXY"))
try:
    urllib.request.urlopen("http://127.0.0.2:%[1]d/", timeout=10)
    print("through the proxy: reached")
except urllib.error.HTTPError as e:
    print("through the proxy:", e.code, e.read().decode().strip())
try:
    socket.create_connection(("127.0.0.2", %[1]d), timeout=5)
    print("direct: reached")
except OSError:
    print("direct: refused")
`, port)
	code, out, stderr := sandboxctl(t, "", "run", "--config", cfg, "--agent", "net", "--areas-root", areas, "--", "python3", "-c", probe)
	if code != 0 {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, stderr)
	}
	for _, want := range []string{"proxy " + egress.ProxyURL, "through the proxy: 403", "this node's own address", "direct: refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("the command said %q, lacking %q", out, want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(areas, ".sandboxctl", "netns", "*")); len(left) > 0 {
		t.Errorf("network namespaces left after the run: %v", left)
	}
}

// sandboxctl's proxies refuse this host's own addresses, as the
// controller's do, whatever range would open them: a permitted name
// resolving to the host's public address would reach the host's own
// services (found by review).
func TestLocalNetworksRefuseTheHost(t *testing.T) {
	n, err := localNetworks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	own, err := egress.HostAddresses()
	if err != nil {
		t.Fatal(err)
	}
	pol := egress.Policy{NodeNets: n.NodeNets, AllowedNets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}
	for _, p := range own {
		if !slices.Contains(n.NodeNets, p) || pol.Reachable(p.Addr()) {
			t.Errorf("this host's %s is not among the proxies' node addresses %v", p, n.NodeNets)
		}
	}
}

// gc lists the trees of a state directory that is gone and removes them,
// with their mounts; --dry-run removes nothing.
func TestGCRemovesAbandonedTrees(t *testing.T) {
	needBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mount trees are built only as root: run the tests as root (CI does)")
	}
	dir := t.TempDir()
	clone := filepath.Join(dir, "clone")
	// What an interrupted serve leaves: instances ensured, never stopped.
	state := filepath.Join(clone, "areas", ".sandboxctl")
	rt, err := bwrap.New(bwrap.Config{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	for _, agent := range []string{"gc-a", "gc-b"} {
		spec := v1alpha1.SandboxSpec{Agent: agent, Binaries: []v1alpha1.BinaryName{"true"}}
		in, err := instance.Standalone(&spec, instance.Host{AreasRoot: filepath.Join(clone, "areas")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Ensure(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	trees := bwrap.TreesDir(state)
	if n := testenv.MountsBelow(t, trees); n < 2 {
		t.Fatalf("%d mounts below %s after two instances", n, trees)
	}
	if err := os.RemoveAll(clone); err != nil {
		t.Fatal(err)
	}
	other := []string{"--areas-root", filepath.Join(dir, "other")}
	code, out, _ := sandboxctl(t, "", append([]string{"gc", "--dry-run"}, other...)...)
	if code != 0 || !strings.Contains(out, "stale\t"+trees+"\tits state directory "+state+" is gone") {
		t.Fatalf("gc --dry-run: exit %d %q", code, out)
	}
	if _, err := os.Stat(trees); err != nil {
		t.Fatalf("--dry-run removed %s: %v", trees, err)
	}
	code, out, errOut := sandboxctl(t, "", append([]string{"gc"}, other...)...)
	if code != 0 || !strings.Contains(out, "removed\t"+trees) {
		t.Fatalf("gc: exit %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(trees); !os.IsNotExist(err) {
		t.Fatalf("%s after gc: %v", trees, err)
	}
	if n := testenv.MountsBelow(t, trees); n != 0 {
		t.Fatalf("%d mounts below %s after gc", n, trees)
	}
}

// run leaves an instance without custom mounts as it is: the next run
// verifies its mount tree and reuses it instead of building and removing
// one each time. One with a custom mount is stopped, its tree gone, as
// before: its mount points are directories of the agent's workspace.
func TestRunKeepsTheTreeForTheNextRun(t *testing.T) {
	needBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mount trees are built only as root: run the tests as root (CI does)")
	}
	dir := t.TempDir()
	areas := filepath.Join(dir, "areas")
	state := filepath.Join(areas, ".sandboxctl")
	t.Cleanup(func() { _ = bwrap.DetachTrees(state) })
	trees := bwrap.TreesDir(state)
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\"]\n")
	base := []string{"run", "--config", cfg, "--agent", "kim", "--areas-root", areas, "--"}

	code, _, stderr := sandboxctl(t, "", append(base, "sh", "-c", "echo one > /workspace/f")...)
	if code != 0 {
		t.Fatalf("first run: exit %d: %s", code, stderr)
	}
	kept := testenv.MountsBelow(t, trees)
	if kept == 0 {
		t.Fatalf("no mount below %s after a run: the tree was removed", trees)
	}
	gen, err := os.ReadDir(filepath.Join(trees, "cireilclaw-kim"))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		code, out, stderr := sandboxctl(t, "", append(base, "sh", "-c", "read l < /workspace/f; echo $l")...)
		if code != 0 || out != "one\n" {
			t.Fatalf("next run: exit %d %q %s", code, out, stderr)
		}
	}
	if n := testenv.MountsBelow(t, trees); n != kept {
		t.Errorf("%d mounts below %s after three more runs, %d after the first: a run built a tree again", n, trees, kept)
	}
	again, _ := os.ReadDir(filepath.Join(trees, "cireilclaw-kim"))
	if len(again) != len(gen) || again[0].Name() != gen[0].Name() {
		t.Errorf("tree generations %v after more runs, %v after the first", again, gen)
	}

	// A changed configuration is taken by the next run.
	writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\", \"cat\"]\n")
	code, out, stderr := sandboxctl(t, "", append(base, "cat", "/workspace/f")...)
	if code != 0 || out != "one\n" {
		t.Fatalf("run after a change: exit %d %q %s", code, out, stderr)
	}

	// A custom mount: the instance is stopped, and the agent's directory
	// holding the mount point can be removed.
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	mnt := writeConfig(t, dir, fmt.Sprintf("mounts = [{source = %q, target = \"a/src\", mode = \"ro\"}]\n[bwrap]\nbinaries = [\"sh\"]\n", src))
	code, _, stderr = sandboxctl(t, "", "run", "--config", mnt, "--agent", "lou", "--areas-root", areas, "--", "sh", "-c", "test -d /workspace/a/src")
	if code != 0 {
		t.Fatalf("run with a custom mount: exit %d: %s", code, stderr)
	}
	if n := testenv.MountsBelow(t, filepath.Join(trees, "cireilclaw-lou")); n != 0 {
		t.Errorf("%d mounts left of an instance with a custom mount", n)
	}
	if err := os.RemoveAll(filepath.Join(areas, "lou", "workspace", "a")); err != nil {
		t.Errorf("removing the agent's directory that held the mount point: %v", err)
	}
}

// What a command prints is the agent's to choose: serve keeps a bounded
// part of it and ends a command that prints more, rather than holding all
// of it (and its JSON, up to six times as large) in memory.
func TestServeBoundsWhatItKeepsOfACommandsOutput(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	cfg := writeConfig(t, dir, "[bwrap]\nbinaries = [\"sh\", \"head\", \"yes\"]\n")
	sv := startServe(t, cfg, filepath.Join(dir, "areas"))
	responses, send := sv.responses, sv.send

	// 64 MiB on stdout and as much on stderr: four times what is kept.
	send(`["sh","-c","yes | head -c 67108864; yes | head -c 67108864 >&2"]`)
	r := responses.next(t)
	if kept := len(r.Stdout) + len(r.Stderr); kept > maxServeOutput {
		t.Fatalf("serve kept %d bytes of output, more than its %d", kept, maxServeOutput)
	}
	if r.Error == "" || !strings.Contains(r.Error, "output") || r.Exit != exitFailed {
		t.Fatalf("a command past the bound must be ended and said so: exit %d error %q", r.Exit, r.Error)
	}
	// Output that never ends is ended too.
	send(`["yes"]`)
	if r := responses.next(t); r.Error == "" || len(r.Stdout) > maxServeOutput {
		t.Fatalf("yes: exit %d error %q, %d bytes kept", r.Exit, r.Error, len(r.Stdout))
	}
	// The next command runs as before.
	send(`["sh","-c","echo hi"]`)
	if r := responses.next(t); r.Exit != 0 || r.Stdout != "hi\n" || r.Error != "" {
		t.Fatalf("after the bound: %+v", r)
	}
	sv.stop(t)
}
