package execapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// The aggregated API in this suite: the API server started with the
// front-proxy flags of a cluster that serves aggregated APIs (its own
// request-header CA and proxy client certificate, made here), and the
// APIService routed to exec API servers listening on an address of this
// machine that is not loopback (the API server refuses loopback endpoints).
const (
	aggServiceNS   = servingcert.DefaultNamespace
	aggServiceName = "sandbox-controller-exec-api"
	frontProxyName = "front-proxy-client"
)

var (
	// nodeIP is an address of this machine the API server may proxy to;
	// empty when there is none (the aggregated specs then fail under CI
	// and are skipped elsewhere).
	nodeIP string
	// aggCA is the cluster's exec API CA of the aggregated specs: it signs
	// the nodes' serving certificates, and every node holds it.
	aggCA *servingcert.CA
	// fwdCA is the forwarder CA, which only the aggregated API holds.
	fwdCA *servingcert.CA
	// hostNode is the exec API of the node that runs the suite's
	// Sandboxes (the manager's).
	hostNode *nodeAPI
	// aggAPI is the aggregated API's own server (--mode=api), which the
	// APIService routes to.
	aggAPI        *nodeAPI
	installAPISvc sync.Once
)

// findNodeIP is the first IPv4 address of an interface that is up and
// not loopback.
func findNodeIP() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	return ""
}

// configureFrontProxy makes the front proxy's CA and client certificate
// in dir and gives them to the API server with the aggregator's flags.
func configureFrontProxy(dir string) {
	ca, err := servingcert.NewCA(time.Now())
	Expect(err).NotTo(HaveOccurred())
	cert, err := ca.IssueClient(frontProxyName, 24*time.Hour, time.Now())
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	Expect(err).NotTo(HaveOccurred())
	caFile, certFile, keyFile := filepath.Join(dir, "front-proxy-ca.crt"), filepath.Join(dir, "front-proxy-client.crt"), filepath.Join(dir, "front-proxy-client.key")
	Expect(os.WriteFile(caFile, ca.PEM, 0o600)).To(Succeed())
	Expect(os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600)).To(Succeed())
	Expect(os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)).To(Succeed())
	args := testEnv.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", caFile)
	args.Set("requestheader-allowed-names", frontProxyName)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", certFile)
	args.Set("proxy-client-key-file", keyFile)
	args.Set("enable-aggregator-routing", "true")
}

// nodeAPI is one exec API server: a node's, or the aggregated API's.
type nodeAPI struct {
	addr string // host:port
	reg  *prometheus.Registry
	stop context.CancelFunc
	done chan error
}

// reserveAddress is a free port on nodeIP.
func reserveAddress() string {
	ln, err := net.Listen("tcp", net.JoinHostPort(nodeIP, "0"))
	Expect(err).NotTo(HaveOccurred())
	addr := ln.Addr().String()
	Expect(ln.Close()).To(Succeed())
	return addr
}

// startNodeAPI serves the exec API as a node's controller does next to
// the aggregated API: a certificate of aggCA for the node's address, and
// requests the aggregated API forwards taken as the user they name only
// with a client certificate of fwdCA for the forwarder's name.
func startNodeAPI(bind, nodeName string, reader client.Reader, ttl time.Duration) *nodeAPI {
	cert, err := aggCA.Issue([]string{nodeIP}, 24*time.Hour, time.Now())
	Expect(err).NotTo(HaveOccurred())
	// No client CA file, as in the DaemonSet: client certificates are
	// checked against the API server's own client CA (its ConfigMap
	// kube-system/extension-apiserver-authentication).
	cfg := execapi.Config{BindAddress: bind, ClusterClientCA: true, AuthCacheTTL: ttl}
	auth, err := execapi.DelegatingAuth(kube, cfg)
	Expect(err).NotTo(HaveOccurred())
	Expect(execapi.PeerAuth(fwdCA.PEM, servingcert.ForwarderName, &auth)).To(Succeed())
	return serveExecAPI(cfg, execapi.Options{
		Reader:         reader,
		Runtimes:       map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: mgr.Runtimes[v1alpha1.BackendBwrap]},
		Host:           instance.Host{AreasRoot: env.AreasRoot, Home: "/nonexistent-home"},
		NodeName:       nodeName,
		Auth:           auth,
		Log:            logf.Log.WithName("execapi-node" + nodeName),
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil },
	})
}

// startAggregatedAPI serves the aggregated API as --mode=api does: a
// certificate of fwdCA for the Service's name, the API server's proxied
// requests taken as the user they name, and every request forwarded to
// the node of the claim's Sandbox with fwdCA's forwarder certificate;
// with unplaced, also a Sandbox's on no node, to the claim's endpoint (the
// suite's node is one controller without a node name).
func startAggregatedAPI(bind string, reader client.Reader, unplaced bool) *nodeAPI {
	svc := aggServiceName + "." + aggServiceNS + ".svc"
	cert, err := fwdCA.Issue([]string{svc}, 24*time.Hour, time.Now())
	Expect(err).NotTo(HaveOccurred())
	fwd, err := fwdCA.IssueClient(servingcert.ForwarderName, 24*time.Hour, time.Now())
	Expect(err).NotTo(HaveOccurred())
	cfg := execapi.Config{BindAddress: bind, ClusterClientCA: true, AuthCacheTTL: execapi.DefaultAuthCacheTTL}
	auth, err := execapi.DelegatingAuth(kube, cfg)
	Expect(err).NotTo(HaveOccurred())
	Expect(execapi.FrontProxyAuth(kube, logf.Log.WithName("execapi-aggregated"), &auth)).To(Succeed())
	return serveExecAPI(cfg, execapi.Options{
		Reader:         reader,
		Auth:           auth,
		Log:            logf.Log.WithName("execapi-aggregated"),
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil },
		Forwarding: &execapi.Forwarding{CAPEM: aggCA.PEM, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return fwd, nil
		}},
		ForwardOnly:     true,
		ForwardUnplaced: unplaced,
	})
}

// serveExecAPI starts a server with a metrics registry of its own.
func serveExecAPI(cfg execapi.Config, opts execapi.Options) *nodeAPI {
	n := &nodeAPI{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	opts.Registerer = n.reg
	srv, err := execapi.New(cfg, opts)
	Expect(err).NotTo(HaveOccurred())
	addr, err := srv.Listen()
	Expect(err).NotTo(HaveOccurred())
	n.addr = addr.String()
	runCtx, stop := context.WithCancel(context.Background())
	n.stop = stop
	go func() { n.done <- srv.Start(runCtx) }()
	return n
}

func (n *nodeAPI) Stop() {
	n.stop()
	Eventually(n.done, timeout).Should(Receive(BeNil()))
}

// counter is the value of a counter metric of the node's exec API.
func (n *nodeAPI) counter(name string) float64 {
	mfs, err := n.reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// installAggregatedAPI creates the Service and the APIService of
// config/aggregated and sets the APIService's caBundle as the controller
// does, once.
func installAggregatedAPI() {
	installAPISvc.Do(func() {
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: aggServiceNS}})).To(Or(Succeed(), Satisfy(apierrors.IsAlreadyExists)))
		// No selector: the test keeps the endpoints itself (routeTo).
		Expect(env.Client.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: aggServiceNS, Name: aggServiceName},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(10350)}}},
		})).To(Succeed())
		svc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiregistration.k8s.io/v1",
			"kind":       "APIService",
			"metadata":   map[string]any{"name": execapi.APIServiceName},
			"spec": map[string]any{
				"group":                execapi.AggregatedGroup,
				"version":              execapi.AggregatedVersion,
				"service":              map[string]any{"namespace": aggServiceNS, "name": aggServiceName, "port": int64(443)},
				"groupPriorityMinimum": int64(1000),
				"versionPriority":      int64(15),
			},
		}}
		Expect(env.Client.Create(ctx, svc)).To(Succeed())
		found, err := servingcert.PublishAPIService(ctx, env.Client, execapi.APIServiceName, fwdCA.PEM)
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
	})
}

// routeTo points the Service's endpoints at an exec API server (the
// aggregated API's) and waits until the APIService is Available through
// it.
func routeTo(n *nodeAPI) {
	host, portStr, err := net.SplitHostPort(n.addr)
	Expect(err).NotTo(HaveOccurred())
	port, err := strconv.Atoi(portStr)
	Expect(err).NotTo(HaveOccurred())
	// The API server routes by the Service's EndpointSlices.
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: aggServiceNS, Name: aggServiceName + "-test"}}
	_, err = ctrlCreateOrUpdate(slice, func() {
		slice.Labels = map[string]string{discoveryv1.LabelServiceName: aggServiceName}
		slice.AddressType = discoveryv1.AddressTypeIPv4
		slice.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}
		slice.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}}
	})
	Expect(err).NotTo(HaveOccurred())
	Eventually(apiServiceAvailable, timeout).Should(Equal("True"))
}

func ctrlCreateOrUpdate(obj client.Object, mutate func()) (bool, error) {
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		mutate()
		return true, env.Client.Create(ctx, obj)
	}
	if err != nil {
		return false, err
	}
	mutate()
	return false, env.Client.Update(ctx, obj)
}

// apiServiceAvailable is the status of the APIService's Available
// condition, with its message when it is not True.
func apiServiceAvailable() string {
	svc := &unstructured.Unstructured{}
	svc.SetAPIVersion("apiregistration.k8s.io/v1")
	svc.SetKind("APIService")
	if err := env.Client.Get(ctx, client.ObjectKey{Name: execapi.APIServiceName}, svc); err != nil {
		return err.Error()
	}
	conds, _, _ := unstructured.NestedSlice(svc.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Available" {
			if m["status"] == "True" {
				return "True"
			}
			return fmt.Sprintf("%v: %v", m["reason"], m["message"])
		}
	}
	return "no Available condition"
}
