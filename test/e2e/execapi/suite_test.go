// Package execapi_test runs the exec and file API against a real API
// server (envtest) with real authentication and authorisation: certificate
// users made by envtest, a service account token from TokenRequest, and
// RBAC objects created by the tests. Commands run in real bwrap sandboxes
// converged by the controllers. Under CI=true a missing envtest binary or
// bwrap fails the suite; elsewhere it is skipped with the setup command.
package execapi_test

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

const timeout = testharness.Timeout

var (
	testEnv *envtest.Environment
	env     *testharness.Env
	mgr     *testharness.Manager
	kube    kubernetes.Interface
	// apiHost is the exec API's base URL; servingCA verifies it.
	apiHost   string
	servingCA []byte
	ctx       = context.Background()
	stopAPI   context.CancelFunc
	apiDone   = make(chan error, 1)
)

func TestExecAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Exec API suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (apt-get install bubblewrap, or hack/install-deps.sh)")
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(GinkgoT(), "envtest binaries", p)
	}
	env = startEnv()
	kube = kubernetes.NewForConfigOrDie(env.Config)

	// Commands start as the controller starts them: through the starter
	// beside its binary.
	drv, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(env.Dir, "bwrap"), Starter: testenv.Starter(GinkgoT())})
	Expect(err).NotTo(HaveOccurred())
	// The manager's claims publish the host node's exec API, which serves
	// the aggregated API too when this machine has an address the API
	// server may proxy to.
	var endpoint string
	if nodeIP = findNodeIP(); nodeIP != "" {
		aggCA, err = servingcert.NewCA(time.Now())
		Expect(err).NotTo(HaveOccurred())
		fwdCA, err = servingcert.NewForwarderCA(time.Now())
		Expect(err).NotTo(HaveOccurred())
		endpoint = reserveAddress()
	}
	mgr = env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{Endpoint: endpoint})
	startAPI()
	if endpoint != "" {
		// As the controller runs it: claims read through the manager's
		// cache, answers of authentication and authorisation cached.
		hostNode = startNodeAPI(endpoint, "", mgr.Client, execapi.DefaultAuthCacheTTL)
		aggAPI = startAggregatedAPI(reserveAddress(), mgr.Client, true)
	}
})

var _ = AfterSuite(func() {
	if aggAPI != nil {
		aggAPI.Stop()
	}
	if hostNode != nil {
		hostNode.Stop()
	}
	if stopAPI != nil {
		stopAPI()
		Eventually(apiDone, timeout).Should(Receive(BeNil()))
	}
	if mgr != nil {
		mgr.Stop()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
	if env != nil {
		Expect(bwrap.DetachTrees(filepath.Join(env.Dir, "bwrap"))).To(Succeed())
		Expect(os.RemoveAll(env.Dir)).To(Succeed())
	}
})

// startEnv starts its own envtest environment, because the suite needs the
// environment itself (AddUser, the client CA file), and builds the shared
// harness around it.
func startEnv() *testharness.Env {
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	testEnv = &envtest.Environment{CRDDirectoryPaths: []string{testenv.CRDDir(3)}, ErrorIfCRDPathMissing: true}
	dir, err := os.MkdirTemp("", "sandbox-execapi-")
	Expect(err).NotTo(HaveOccurred())
	configureFrontProxy(dir)
	cfg, err := localcp.StartEnvironment(testEnv)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return &testharness.Env{Config: cfg, Client: c, Scheme: scheme, AreasRoot: filepath.Join(dir, "areas"), Dir: dir}
}

// clientCAFile is the CA that signs envtest's certificate users.
func clientCAFile() string {
	return filepath.Join(testEnv.ControlPlane.APIServer.CertDir, "client-cert-auth-ca.crt")
}

func startAPI() {
	// The certificate make run serves with: ECDSA P-256, as a deployment
	// should (an RSA key doubles the handshake's cost here).
	caFile, _, _, err := localcp.ServingCert(env.Dir)
	Expect(err).NotTo(HaveOccurred())
	servingCA, err = os.ReadFile(caFile)
	Expect(err).NotTo(HaveOccurred())
	apiHost, stopAPI = serveAPI(env.Client, time.Millisecond, apiDone)
}

// serveAPI starts an exec API server, with the suite's serving
// certificate, reading claims through reader and caching authentication
// and authorisation answers for ttl; it returns the server's https://
// address and what stops it (its end goes to done). The suite's own server
// reads straight from the API server with a millisecond cache, so every
// spec sees what it just wrote; the benchmark's reads through the
// manager's cache as the controller does.
func serveAPI(reader client.Reader, ttl time.Duration, done chan<- error) (string, context.CancelFunc) {
	return serveAPIWith(reader, ttl, done, nil)
}

// serveAPIWith is serveAPI with the certificate getCert serves (nil: the
// suite's certificate files).
func serveAPIWith(reader client.Reader, ttl time.Duration, done chan<- error, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) (string, context.CancelFunc) {
	certFile, keyFile := filepath.Join(env.Dir, "tls.crt"), filepath.Join(env.Dir, "tls.key")
	cfg := execapi.Config{BindAddress: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ClientCAFile: clientCAFile(), AuthCacheTTL: ttl}
	if getCert != nil {
		cfg.CertFile, cfg.KeyFile = "", ""
	}
	auth, err := execapi.DelegatingAuth(kube, cfg)
	Expect(err).NotTo(HaveOccurred())
	srv, err := execapi.New(cfg, execapi.Options{
		Reader:         reader,
		Runtimes:       map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: mgr.Runtimes[v1alpha1.BackendBwrap]},
		Host:           instance.Host{AreasRoot: env.AreasRoot, Home: "/nonexistent-home"},
		Auth:           auth,
		Registerer:     prometheus.NewRegistry(),
		Log:            logf.Log.WithName("execapi"),
		GetCertificate: getCert,
	})
	Expect(err).NotTo(HaveOccurred())
	addr, err := srv.Listen()
	Expect(err).NotTo(HaveOccurred())
	runCtx, stop := context.WithCancel(context.Background())
	go func() { done <- srv.Start(runCtx) }()
	return "https://" + addr.String(), stop
}

// apiConfig is a client configuration for the exec API with the
// credentials of base (a certificate or a token), or none when base is nil.
func apiConfig(base *rest.Config) *rest.Config {
	cfg := &rest.Config{Host: apiHost, TLSClientConfig: rest.TLSClientConfig{CAData: servingCA}}
	if base != nil {
		cfg.BearerToken = base.BearerToken
		cfg.CertData, cfg.KeyData = base.CertData, base.KeyData
	}
	return cfg
}

// serveInstead serves another exec API (as serveAPIWith does) and points
// the suite's requests at it until the returned function, which stops it
// and waits for its end, runs.
func serveInstead(reader client.Reader, ttl time.Duration, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) (host string, restore func()) {
	done := make(chan error, 1)
	host, stop := serveAPIWith(reader, ttl, done, getCert)
	suiteHost := apiHost
	apiHost = host
	return host, func() {
		apiHost = suiteHost
		stop()
		Eventually(done, timeout).Should(Receive(BeNil()))
	}
}
