// Package clients runs the client libraries' own test suites (pytest for
// clients/python) against what `make run` starts: the real controller
// binary with a throw-away local control plane and the bwrap backend, its
// exec API reached directly with the kubeconfig's client certificate.
package clients

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// controlPlane is a running `sandbox-controller --local-control-plane`.
type controlPlane struct {
	kubeconfig string
	areasRoot  string
	k8s        client.Client
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = parent
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startControlPlane builds the controller and starts it as make run does.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		testenv.Missing(t, "KUBEBUILDER_ASSETS (kube-apiserver and etcd)", "hack/envtest-assets.sh, as make test does")
	}
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	root := repoRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandbox-controller")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sandbox-controller")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the controller: %v\n%s", err, out)
	}
	kc := filepath.Join(dir, "local", "kubeconfig")
	logf, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--local-control-plane", "--local-assets", assets,
		"--local-crds", filepath.Join(root, "config", "crd", "bases"), "--local-kubeconfig", kc,
		"--areas-root", filepath.Join(dir, "areas"), "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--api-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--log-format", "console")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("controller log:\n%s", tail(string(b), 60))
		}
	})
	cp := &controlPlane{kubeconfig: kc, areasRoot: filepath.Join(dir, "areas")}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if cp.connect() == nil {
			return cp
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("the local control plane did not come up:\n%s", tail(string(b), 60))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// connect answers once the kubeconfig is written and the API serves
// Sandboxes.
func (cp *controlPlane) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cm corev1.ConfigMap
	// The exec API's CA is published once the controller is set up.
	if err := c.Get(ctx, client.ObjectKey{Namespace: "sandbox-controller-system", Name: "sandbox-controller-ca"}, &cm); err != nil {
		return err
	}
	cp.k8s = c
	return nil
}

// sandbox makes a namespace and a bwrap Sandbox in it for a client suite.
func (cp *controlPlane) sandbox(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	if err := cp.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.SandboxSpec{
			Agent:    ns + "-" + name,
			Binaries: []v1alpha1.BinaryName{"sh", "cat", "mkdir", "truncate"},
		},
	}
	if err := cp.k8s.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

// The Python client's own suite, with the interpreter and the Debian
// packages CI installs (python3-kubernetes, python3-websocket,
// python3-pytest).
func TestPythonClient(t *testing.T) {
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import kubernetes, websocket, pytest").Run(); err != nil {
		testenv.Missing(t, "python3 with python3-kubernetes, python3-websocket and python3-pytest",
			"hack/install-deps.sh python3-kubernetes python3-websocket python3-pytest, as make test does")
	}
	cp := startControlPlane(t)
	cp.sandbox(t, "py", "python")
	root := repoRoot(t)
	cmd := exec.Command(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "clients/python/tests")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "clients", "python"),
		"SANDBOX_KUBECONFIG="+cp.kubeconfig, "SANDBOX_NAMESPACE=py", "SANDBOX_NAME=python", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("the Python client's suite failed: %v", err)
	}
	if !strings.Contains(string(out), "passed") || strings.Contains(string(out), "skipped") {
		t.Fatalf("the Python client's suite ran no test or skipped some:\n%s", out)
	}
}

// The TypeScript client's own suite (node's test runner), and the MCP
// server driven by the official TypeScript SDK's client over stdio
// (sandboxctl mcp) and streamable HTTP (the claim's exec API endpoint).
// Its dependencies come from the npm registry, as package-lock.json pins
// them.
func TestTypeScriptClient(t *testing.T) {
	node := testenv.Binary(t, "node", "install Node.js 20 or later")
	root := repoRoot(t)
	pkg := filepath.Join(root, "clients", "typescript")
	npmBuild(t, pkg)
	dir := t.TempDir()
	sandboxctl := filepath.Join(dir, "sandboxctl")
	build := exec.Command("go", "build", "-o", sandboxctl, "./cmd/sandboxctl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building sandboxctl: %v\n%s", err, out)
	}
	config := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(config, []byte("[bwrap]\nbinaries = [\"sh\", \"cat\", \"mkdir\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t)
	cp.sandbox(t, "ts", "typescript")
	cmd := exec.Command(node, "--test", "test/")
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), "SANDBOX_KUBECONFIG="+cp.kubeconfig, "SANDBOX_NAMESPACE=ts", "SANDBOX_NAME=typescript",
		"SANDBOXCTL="+sandboxctl, "SANDBOXCTL_CONFIG="+config, "SANDBOXCTL_AREAS="+filepath.Join(dir, "areas"))
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript client's suite failed: %v", err)
	}
	if !strings.Contains(string(out), "# pass 5") || !strings.Contains(string(out), "# skipped 0") {
		t.Fatalf("the TypeScript suite did not run its five tests:\n%s", out)
	}
}

// npmBuild installs the TypeScript client's locked dependencies and builds it.
func npmBuild(t *testing.T, pkg string) {
	t.Helper()
	npm := testenv.Binary(t, "npm", "install npm")
	for _, args := range [][]string{{"ci", "--no-fund", "--no-audit"}, {"run", "build"}} {
		cmd := exec.Command(npm, args...)
		cmd.Dir = pkg
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The agent loops of examples/ (Python, TypeScript, Go) each claim a
// Sandbox with a worktree of a host repository, run git in it, write a
// file there, show the diff and see a command refused.
func TestExamples(t *testing.T) {
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import kubernetes, websocket").Run(); err != nil {
		testenv.Missing(t, "python3 with python3-kubernetes and python3-websocket", "hack/install-deps.sh python3-kubernetes python3-websocket")
	}
	node := testenv.Binary(t, "node", "install Node.js 20 or later")
	git := testenv.Binary(t, "git", "install git (hack/install-deps.sh)")
	root := repoRoot(t)
	npmBuild(t, filepath.Join(root, "clients", "typescript"))
	cp := startControlPlane(t)

	// Host git runs as the agent: every parent must let it through.
	top := t.TempDir()
	for _, d := range []string{filepath.Dir(top), top} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	demo := filepath.Join(top, "demo")
	repo := filepath.Join(demo, "app")
	for _, args := range [][]string{{"init", "-q", "-b", "main", repo}, {"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "first"}} {
		if out, err := exec.Command(git, args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	ctx := context.Background()
	if err := cp.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ex"}}); err != nil {
		t.Fatal(err)
	}
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ex", Name: "demo"},
		Spec: v1alpha1.SandboxSpec{Agent: "ex-demo", Binaries: []v1alpha1.BinaryName{"git", "sh", "cat"},
			Mounts: []v1alpha1.Mount{{Source: demo, Target: "demo", Mode: v1alpha1.MountReadWrite}}},
	}
	if err := cp.k8s.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	// Deleted while the controller still runs, so that it takes down the
	// instance's mount trees before the test's directories go.
	t.Cleanup(func() {
		_ = cp.k8s.Delete(ctx, sb)
		testenv.Eventually(t, time.Minute, "the Sandbox is deleted", func() bool {
			return cp.k8s.Get(ctx, client.ObjectKeyFromObject(sb), &v1alpha1.Sandbox{}) != nil
		})
	})
	// The agent runs as a host id of its own, the owner of its areas
	// directory: the project is given to it, as a user would.
	var owner *syscall.Stat_t
	testenv.Eventually(t, time.Minute, "the agent's areas directory is given its host id", func() bool {
		if fi, err := os.Stat(filepath.Join(cp.areasRoot, "ex-demo")); err == nil {
			owner = fi.Sys().(*syscall.Stat_t)
		}
		return owner != nil && owner.Uid != 0
	})
	if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", owner.Uid, owner.Gid), demo).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}

	env := append(os.Environ(), "KUBECONFIG="+cp.kubeconfig, "PYTHONPATH="+filepath.Join(root, "clients", "python"), "PYTHONDONTWRITEBYTECODE=1")
	for _, ex := range []struct {
		name string
		argv []string
	}{
		{"python", []string{python, "examples/python/agent_loop.py", "demo", "demo/app", "--namespace", "ex"}},
		{"typescript", []string{node, "examples/typescript/agent-loop.mjs", "demo", "demo/app", "ex"}},
		{"go", []string{"go", "run", "./examples/go/agentloop", "-n", "ex", "demo", "demo/app"}},
	} {
		t.Run(ex.name, func(t *testing.T) {
			cmd := exec.Command(ex.argv[0], ex.argv[1:]...)
			cmd.Dir, cmd.Env = root, env
			out, err := cmd.CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Fatalf("the %s example failed: %v", ex.name, err)
			}
			for _, want := range []string{"## ", "first", "+Written by the agent.", "refused"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("the %s example's output lacks %q", ex.name, want)
				}
			}
		})
	}
}
