package execapi_test

import (
	"context"
	"crypto/x509"
	"net"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// A node's exec API serving certificate is signed by the aggregated API
// (servingcert.Signer) for the node the requester's token is bound to, and
// only for that node's name and addresses: a taken node cannot have one
// made for another node's address, nor can anyone but the nodes'
// controllers. The API server sets who asks (spec.username and the token's
// node in spec.extra), not the requester.
var _ = Describe("the nodes' serving certificates", Ordered, func() {
	const (
		sys    = servingcert.DefaultNamespace
		nodeSA = "system:serviceaccount:" + sys + ":sandbox-controller"
	)
	var (
		caPEM []byte
		stop  context.CancelFunc
	)
	// asNode is a client with the credentials of the nodes' controllers'
	// ServiceAccount, as a token bound to a pod on node carries them.
	asNode := func(user, node string) client.Client {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
			Extra: map[string][]string{servingcert.NodeNameExtra: {node}}}
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	load := func(c client.Client, node string, hosts ...string) (*servingcert.Source, error) {
		src := &servingcert.Source{Client: c, Namespace: sys, Request: true, Node: node, Hosts: hosts,
			Validity: time.Hour, Log: logf.Log.WithName("servingcert")}
		loadCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return src, src.Load(loadCtx)
	}

	BeforeAll(func() {
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sys}})).To(Or(Succeed(), Satisfy(apierrors.IsAlreadyExists)))
		applyYAML(filepath.Join(testenv.CRDDir(3), "..", "..", "rbac", "ca_reader.yaml"))
		// The nodes' own rights on requests (config/rbac/role.yaml), for
		// the ServiceAccount and for one other user.
		Expect(env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "csr-requester"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get"}}}})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "csr-requester"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "csr-requester"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: nodeSA},
				{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}}})).To(Succeed())
		// node-e's kubelet (taken) reports node-d's address as its own too.
		for name, ip := range map[string]string{"node-a": "10.20.0.1", "node-b": "10.20.0.2", "node-d": "10.20.0.9", "node-e": "10.20.0.9"} {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			Expect(env.Client.Create(ctx, n)).To(Succeed())
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
			Expect(env.Client.Status().Update(ctx, n)).To(Succeed())
		}

		By("running the aggregated API's signer with the exec API's CA")
		ca, err := servingcert.ExecAPICA.Ensure(ctx, env.Client, sys, time.Now())
		Expect(err).NotTo(HaveOccurred())
		Expect(servingcert.ExecAPICA.Publish(ctx, env.Client, sys, ca.PEM)).To(Succeed())
		caPEM = ca.PEM
		mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
		Expect(err).NotTo(HaveOccurred())
		Expect((&servingcert.Signer{Client: mgr.GetClient(), User: nodeSA, CA: ca, Validity: 24 * time.Hour}).SetupWithManager(mgr)).To(Succeed())
		var runCtx context.Context
		runCtx, stop = context.WithCancel(ctx)
		go func() {
			defer GinkgoRecover()
			Expect(mgr.Start(runCtx)).To(Succeed())
		}()
	})
	AfterAll(func() {
		if stop != nil {
			stop()
		}
	})

	It("signs a node's request for its own name and address, with a key the node alone holds", func() {
		src, err := load(asNode(nodeSA, "node-a"), "node-a", "10.20.0.1", "node-a")
		Expect(err).NotTo(HaveOccurred())
		cert, err := src.GetCertificate(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(cert.Leaf.IPAddresses).To(HaveLen(1))
		Expect(cert.Leaf.IPAddresses[0].Equal(net.ParseIP("10.20.0.1"))).To(BeTrue())
		Expect(cert.Leaf.DNSNames).To(Equal([]string{"node-a"}))
		roots := x509.NewCertPool()
		Expect(roots.AppendCertsFromPEM(caPEM)).To(BeTrue())
		_, err = cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "node-a", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		Expect(err).NotTo(HaveOccurred(), "the certificate verifies against the exec API's CA, which clients trust")
		Expect(src.CAPEM()).To(Equal(caPEM))
		Expect(cert.Leaf.Subject.CommonName).To(Equal("sandbox-controller exec API node-a"), "the subject is the signer's, not the request's")
		Expect(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore)).To(BeNumerically("<=", servingcert.MaxNodeValidity+5*time.Minute), "nothing revokes it: a day at most")
	})

	DescribeTable("denies what is not a node's own, saying which rule it broke",
		func(user, tokenNode string, hosts []string, want string) {
			_, err := load(asNode(user, tokenNode), tokenNode, hosts...)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(And(ContainSubstring("Denied"), ContainSubstring(want)))
		},
		Entry("another node's address", nodeSA, "node-a", []string{"10.20.0.2"}, "address 10.20.0.2 is not one node node-a reports"),
		Entry("another node's name", nodeSA, "node-a", []string{"10.20.0.1", "node-b"}, `DNS name "node-b" is not node node-a's name`),
		Entry("any other name", nodeSA, "node-a", []string{"kubernetes.default.svc"}, `DNS name "kubernetes.default.svc" is not node node-a's name`),
		Entry("a node that does not exist", nodeSA, "node-z", []string{"10.20.0.1"}, "node node-z, which the request's credentials name, does not exist"),
		Entry("an address another node reports too", nodeSA, "node-d", []string{"10.20.0.9"}, "address 10.20.0.9 is reported by node node-e too"),
		Entry("a user other than the nodes' controllers", "mallory", "node-a", []string{"10.20.0.1"}, "signs only for the nodes' controllers"),
	)
})
