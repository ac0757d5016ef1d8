package servingcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const testUser = "system:serviceaccount:sandbox-controller-system:sandbox-controller"

func testRequest(t *testing.T, tmpl *x509.CertificateRequest, usages ...certv1.KeyUsage) *certv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	if usages == nil {
		usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}
	}
	return &certv1.CertificateSigningRequest{Spec: certv1.CertificateSigningRequestSpec{
		Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: SignerName,
		Username: testUser, Extra: map[string]certv1.ExtraValue{NodeNameExtra: {"node-a"}}, Usages: usages,
	}}
}

// What the API server cannot say for the signer: the usages asked for and
// the names a request carries besides addresses and DNS names.
func TestCheckRequestRefusesWhatNoServingCertificateNeeds(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}, {Type: corev1.NodeHostName, Address: "10.9.9.9"}}}}
	ok := &x509.CertificateRequest{IPAddresses: []net.IP{net.ParseIP("10.0.0.7")}, DNSNames: []string{"node-a"}}
	if _, err := CheckRequest(testRequest(t, ok), testUser, node); err != nil {
		t.Fatalf("a node's own request: %v", err)
	}
	evil, _ := url.Parse("spiffe://cluster/ns/x")
	for _, c := range []struct {
		name string
		csr  *certv1.CertificateSigningRequest
		want string
	}{
		{"client auth", testRequest(t, ok, certv1.UsageDigitalSignature, certv1.UsageServerAuth, certv1.UsageClientAuth), `usage "client auth"`},
		{"no server auth", testRequest(t, ok, certv1.UsageDigitalSignature), "needs server auth"},
		{"an e-mail address", testRequest(t, &x509.CertificateRequest{DNSNames: []string{"node-a"}, EmailAddresses: []string{"a@b"}}), "no e-mail address or URI"},
		{"a URI", testRequest(t, &x509.CertificateRequest{DNSNames: []string{"node-a"}, URIs: []*url.URL{evil}}), "no e-mail address or URI"},
		{"no name at all", testRequest(t, &x509.CertificateRequest{}), "names no address or name"},
		{"an address the Node lists as a host name", testRequest(t, &x509.CertificateRequest{IPAddresses: []net.IP{net.ParseIP("10.9.9.9")}}), "is not one node node-a reports"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := CheckRequest(c.csr, testUser, node); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("CheckRequest = %v, want an error saying %q", err, c.want)
			}
		})
	}
	// A request whose signature does not hold (its key is not the one that
	// asks) is refused.
	forged := testRequest(t, ok)
	b, _ := pem.Decode(forged.Spec.Request)
	b.Bytes[len(b.Bytes)-3] ^= 0xff
	forged.Spec.Request = pem.EncodeToMemory(b)
	if _, err := CheckRequest(forged, testUser, node); err == nil {
		t.Fatal("a request with a broken signature was accepted")
	}
}
