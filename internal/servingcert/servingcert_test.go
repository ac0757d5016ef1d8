package servingcert

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"
)

func TestIssuedCertificateVerifiesForItsHostsOnly(t *testing.T) {
	now := time.Now()
	ca, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue([]string{"10.1.2.3", "node-a"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	for _, host := range []string{"10.1.2.3", "node-a"} {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.1.2.4"}); err == nil {
		t.Error("verifies for an address it was not issued for")
	}
	if !cert.Leaf.IPAddresses[0].Equal(net.ParseIP("10.1.2.3")) || cert.Leaf.IsCA {
		t.Errorf("leaf %v CA=%v", cert.Leaf.IPAddresses, cert.Leaf.IsCA)
	}
	// Never valid past the CA.
	late, err := ca.Issue([]string{"node-a"}, 20*365*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if late.Leaf.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("certificate valid until %s, past its CA's %s", late.Leaf.NotAfter, ca.Cert.NotAfter)
	}
	if _, err := ca.Issue(nil, time.Hour, now); err == nil {
		t.Error("issued a certificate for no host")
	}
}

func TestASecretWithoutACAIsRefused(t *testing.T) {
	now := time.Now()
	ca, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"node-a"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if _, err := ExecAPICA.parse(leafPEM, keyPEM); err == nil || !strings.Contains(err.Error(), "does not hold a CA") {
		t.Errorf("a serving certificate taken for the CA: %v", err)
	}
	if _, err := ExecAPICA.parse(ca.PEM, keyPEM); err == nil {
		t.Error("a CA certificate with another key accepted")
	}
}

func TestIssueClientIsForClientAuthOnly(t *testing.T) {
	now := time.Now()
	ca, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.IssueClient(ForwarderName, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if c.Leaf.Subject.CommonName != ForwarderName {
		t.Errorf("CN = %q", c.Leaf.Subject.CommonName)
	}
	if len(c.Leaf.ExtKeyUsage) != 1 || c.Leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("ExtKeyUsage = %v, want client auth only", c.Leaf.ExtKeyUsage)
	}
	if len(c.Leaf.DNSNames)+len(c.Leaf.IPAddresses) != 0 {
		t.Error("a client certificate names no host")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("the forwarder's certificate must not serve")
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("verifying as a client: %v", err)
	}
	if _, err := ca.IssueClient("", time.Hour, now); err == nil {
		t.Error("a client certificate without a name is refused")
	}
}
