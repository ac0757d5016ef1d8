package clients

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// fakeNode is an HTTPS server with a certificate of the exec API's CA that
// records what reaches it.
type fakeNode struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func (n *fakeNode) requests() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.seen...)
}

// startFakeNode serves a certificate for 127.0.0.1 and dnsName, signed by ca.
func startFakeNode(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, dnsName string) *fakeNode {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{dnsName}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{}
	n.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		n.seen = append(n.seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		n.mu.Unlock()
		// Kept open after the answer, as the exec API keeps it: a client
		// must end what it refused itself.
		http.Error(w, `{"message":"a fake node"}`, http.StatusNotFound)
	}))
	n.srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	n.srv.StartTLS()
	t.Cleanup(n.srv.Close)
	return n
}

// A claim's status.endpoint is written by a node's controller, and a taken
// node could point another node's claims at itself: the Go client holds
// the node's certificate to the claim's Sandbox's node, and so must the
// Python and TypeScript clients. A server with a certificate of the exec
// API's CA for the endpoint's address but not for the Sandbox's node gets
// no request and no token; the Sandbox's node's own certificate is taken.
func TestNodeClientsHoldTheCertificateToTheSandboxsNode(t *testing.T) {
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import kubernetes, websocket").Run(); err != nil {
		testenv.Missing(t, "python3 with python3-kubernetes and python3-websocket", "hack/install-deps.sh python3-kubernetes python3-websocket, as make test does")
	}
	node := testenv.Binary(t, "node", "install Node.js 20 or later")
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		testenv.Missing(t, "KUBEBUILDER_ASSETS (kube-apiserver and etcd)", "hack/envtest-assets.sh, as make test does")
	}
	root := repoRoot(t)
	npmBuild(t, filepath.Join(root, "clients", "typescript"))

	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kcData, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kcData, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	// The exec API's CA, published as the controller publishes it.
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "exec API CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns, system = "idn", "sandbox-controller-system"
	for _, n := range []string{ns, system} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: system, Name: "sandbox-controller-ca"},
		Data: map[string]string{"ca.crt": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))}}); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sb"},
		Spec: v1alpha1.SandboxSpec{Agent: "idn-sb", NodeName: "node-a", Binaries: []v1alpha1.BinaryName{"cat"}}}); err != nil {
		t.Fatal(err)
	}
	claim := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1"}, Spec: v1alpha1.SessionClaimSpec{SandboxName: "sb"}}
	if err := k8s.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	pointAt := func(n *fakeNode) {
		t.Helper()
		claim.Status.Endpoint = strings.TrimPrefix(n.srv.URL, "https://")
		meta.SetStatusCondition(&claim.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Test", Message: "set by the test"})
		if err := k8s.Status().Update(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}

	const token = "a-token-for-the-exec-api"
	clientsRun := func(t *testing.T) string {
		t.Helper()
		py := exec.Command(python, "-c", `
import sys
from sandbox_client import SandboxClient
c = SandboxClient(kubeconfig=sys.argv[1], namespace="idn", via="node", api_token=sys.argv[2]).use("c1")
for name, call in (("read_file", lambda: c.read_file("/workspace/x")), ("exec", lambda: c.exec(["cat"]))):
    try:
        call()
        print("python", name, "answered")
    except Exception as e:
        print("python", name, "failed:", type(e).__name__, e)
`, kubeconfig, token)
		py.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "clients", "python"), "PYTHONDONTWRITEBYTECODE=1")
		pyOut, _ := py.CombinedOutput()
		// A client that leaves a refused connection open never exits.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		js := exec.CommandContext(ctx, node, "--input-type=module", "-e", `
const { SandboxClient } = await import(process.argv[1]);
const c = SandboxClient.fromKubeconfig({ kubeconfig: process.argv[2], namespace: "idn", via: "node", apiToken: process.argv[3] }).use("c1");
for (const [name, call] of [["readFile", () => c.readFile("/workspace/x")], ["exec", () => c.exec(["cat"])]]) {
  try { await call(); console.log("typescript", name, "answered"); } catch (e) { console.log("typescript", name, "failed:", e.message); }
}
`, "file://"+filepath.Join(root, "clients", "typescript", "dist", "index.js"), kubeconfig, token)
		jsOut, err := js.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("the TypeScript client did not exit within 2 minutes of its calls (%v): a connection it was refused on is left open:\n%s", err, jsOut)
		}
		return string(pyOut) + string(jsOut)
	}

	// A taken node: the exec API's CA signed its certificate, for its own
	// name and the endpoint's address, not for the Sandbox's node.
	taken := startFakeNode(t, ca, caKey, "node-b")
	pointAt(taken)
	out := clientsRun(t)
	t.Logf("clients against the taken node:\n%s", out)
	if got := taken.requests(); len(got) > 0 {
		t.Fatalf("a node whose certificate does not name the Sandbox's node got requests (the token with them): %q", got)
	}
	if strings.Contains(out, "answered") || strings.Count(strings.TrimSpace(out), "\n") != 3 {
		t.Fatalf("want each client's read and exec to fail against the taken node:\n%s", out)
	}

	// The Sandbox's own node, at the same kind of address.
	right := startFakeNode(t, ca, caKey, "node-a")
	pointAt(right)
	out = clientsRun(t)
	t.Logf("clients against the Sandbox's node:\n%s", out)
	got := right.requests()
	if len(got) != 4 {
		t.Fatalf("the Sandbox's node got %d requests, want a read and an exec from each client: %q", len(got), got)
	}
	for _, r := range got {
		if !strings.HasSuffix(r, "Bearer "+token) {
			t.Errorf("a request without the exec API token: %q", r)
		}
	}
}
