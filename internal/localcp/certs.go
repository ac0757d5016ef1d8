package localcp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// ServingCert writes a throw-away CA and a serving certificate for
// 127.0.0.1 and localhost into dir (ca.crt, tls.crt, tls.key), for the exec
// API of a local control plane. It returns the three paths.
func ServingCert(dir string) (caFile, certFile, keyFile string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", "", fmt.Errorf("creating %s: %w", dir, err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sandbox-controller local CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", fmt.Errorf("creating the local CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "sandbox-controller exec API"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", "", fmt.Errorf("creating the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", "", err
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for _, f := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{
		{caFile, "CERTIFICATE", caDER, 0o644},
		{certFile, "CERTIFICATE", der, 0o644},
		{keyFile, "EC PRIVATE KEY", keyDER, 0o600},
	} {
		if err := writeNew(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return "", "", "", fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	return caFile, certFile, keyFile, nil
}

// ClientCAFile is the CA that signed the control plane's client
// certificates (the kubeconfig's user among them).
func (cp *ControlPlane) ClientCAFile() string {
	return filepath.Join(cp.env.ControlPlane.APIServer.CertDir, "client-cert-auth-ca.crt")
}

// PublishCA publishes a local exec API's CA where clients look for it
// (servingcert.ConfigMapName in namespace, made when missing), so that
// `kubectl sandbox exec` and the client libraries need no CA file against
// a local control plane either.
func PublishCA(ctx context.Context, cfg *rest.Config, namespace, caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s for the exec API's CA: %w", namespace, err)
	}
	return servingcert.ExecAPICA.Publish(ctx, c, namespace, ca)
}

// writeNew writes data to a new file of the given mode beside path and
// renames it over path: what was at path (a file of a looser mode, a link
// to another file) is replaced, never written through or kept.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Chmod(mode), f.Close()); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}
