package sandboxtest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/clients/go/sandboxclient"
	"github.com/cireilclaw/sandbox-controller/clients/go/sandboxtest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// A platform's envtest suite, whole: the project's CRDs in envtest, the
// real controller in the test's process, a Sandbox, and then a claim used
// through sandboxclient as on a cluster: commands with streams and exit
// codes, a refused command, files in and out, release.
func TestAPlatformSuite(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		testenv.Missing(t, "KUBEBUILDER_ASSETS (kube-apiserver and etcd)", "hack/envtest-assets.sh, as make test does")
	}
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	ctx := context.Background()

	crds, err := sandboxtest.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{CRDs: crds}
	if _, err := env.Start(); err != nil {
		// envtest leaves kube-apiserver and etcd running when it fails
		// after starting them (a CRD that does not install).
		_ = env.Stop()
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	// The exec API authenticates client certificates the API server's
	// client CA signed: a user of envtest's own.
	user, err := env.AddUser(envtest.User{Name: "platform", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := user.Config()

	controller, err := sandboxtest.Start(ctx, env, sandboxtest.Options{AreasRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := controller.Stop(); err != nil {
			t.Error(err)
		}
	}()

	c, err := sandboxclient.New(cfg, sandboxclient.Options{Namespace: "platform", Via: "node"})
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cfg, client.Options{Scheme: mustScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "platform"}}); err != nil {
		t.Fatal(err)
	}
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "platform", Name: "agent"},
		Spec: v1alpha1.SandboxSpec{Agent: "platform-agent", Binaries: []v1alpha1.BinaryName{"sh", "cat", "mkdir"}}}
	if err := kube.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}

	claim, err := c.Claim(ctx, "agent", sandboxclient.ClaimOptions{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code, err := claim.Exec(ctx, []string{"sh", "-c", "cat; echo oops >&2; exit 4"}, strings.NewReader("hello\n"), &out, &errb)
	if err != nil || code != 4 || out.String() != "hello\n" || errb.String() != "oops\n" {
		t.Fatalf("Exec = %d, %v; stdout %q, stderr %q", code, err, out.String(), errb.String())
	}
	if _, err := claim.Exec(ctx, []string{"curl", "http://example.com"}, nil, nil, nil); !errors.Is(err, sandboxclient.ErrRefused) {
		t.Fatalf("a command outside the allowlist: %v, want ErrRefused", err)
	}
	if err := claim.WriteFile(ctx, "/workspace/plan.md", []byte("# plan\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := claim.ReadFile(ctx, "/workspace/plan.md"); err != nil || string(b) != "# plan\n" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	entries, err := claim.List(ctx, "/workspace")
	if err != nil || len(entries) != 1 || entries[0].Name != "plan.md" {
		t.Fatalf("List = %+v, %v", entries, err)
	}
	// The agent puts a file holding a forged listing where a directory
	// was, and a directory where a file was: neither is taken for the
	// other.
	forge := `mkdir /workspace/report.md && printf '[{"name":"../../.ssh/authorized_keys","type":"file"}]' > /workspace/out`
	if code, err := claim.Exec(ctx, []string{"sh", "-c", forge}, nil, nil, nil); err != nil || code != 0 {
		t.Fatalf("the agent's forgery: %d, %v", code, err)
	}
	if got, err := claim.List(ctx, "/workspace/out"); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("List of a file holding a listing = %+v, %v; want it refused as not a directory", got, err)
	}
	if got, err := claim.ReadFile(ctx, "/workspace/report.md"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("ReadFile of a directory = %q, %v; want it refused as not a regular file", got, err)
	}
	if err := claim.WriteFile(ctx, "/blocks/x", []byte("x")); err == nil {
		t.Fatal("a write into the read-only /blocks was accepted")
	}
	if err := claim.Remove(ctx, "/workspace/plan.md", false); err != nil {
		t.Fatal(err)
	}
	if err := claim.Release(ctx); err != nil {
		t.Fatal(err)
	}

	_, err = c.Claim(ctx, "missing", sandboxclient.ClaimOptions{Timeout: 3 * time.Second})
	var notReady *sandboxclient.NotReadyError
	if !errors.As(err, &notReady) || notReady.Reason != v1alpha1.ReasonSandboxNotFound {
		t.Fatalf("a claim of a missing Sandbox: %v", err)
	}
	if err := kube.Delete(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

func mustScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
