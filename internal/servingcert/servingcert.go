// Package servingcert gives each node's exec API a serving certificate
// without anyone making one: a CA the controllers keep in a Secret of
// their namespace (made by the first controller that finds none), its
// certificate published in a ConfigMap every authenticated user may read
// (as kube-root-ca.crt is), and on each node a certificate for the node's
// exec API address signed by it, renewed in memory at two thirds of its
// life.
//
// Every node's controller holds the CA key, so a node whose controller is
// taken can sign a certificate for another node's address; such a node
// already runs every sandbox it hosts as it likes. Clients verify the
// address they were given (a claim's status.endpoint) against the CA.
package servingcert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// A node's controller's own Role in its namespace (config/rbac/role.yaml):
// it reads the certificates of the exec API's CA, which the aggregated
// API's Deployment makes (config/aggregated) and signs the nodes' serving
// certificates with (csr.go), and of the forwarder CA, and writes neither;
// it reads no CA's key. A node started with --api-service="" makes the
// exec API's CA itself and needs get and create on Secrets and ConfigMaps
// besides.
// +kubebuilder:rbac:groups="",namespace=sandbox-controller-system,resources=configmaps,resourceNames=sandbox-controller-ca;sandbox-controller-forwarder-ca,verbs=get;list;watch

// DefaultNamespace is the controllers' namespace unless they are told
// otherwise (--system-namespace): the Secret and the ConfigMap live there.
const DefaultNamespace = v1alpha1.DefaultSystemNamespace

// Names of the objects in the controllers' namespace.
const (
	// SecretName holds the exec API CA's certificate and key (tls.crt,
	// tls.key): it signs the nodes' serving certificates.
	SecretName = "sandbox-controller-ca"
	// ConfigMapName holds the exec API CA's certificate (ConfigMapKey) for
	// clients.
	ConfigMapName = v1alpha1.ExecCAConfigMap
	// ForwarderSecretName holds the forwarder CA's certificate and key: it
	// signs the aggregated API's serving certificate and the client
	// certificate it forwards requests to the nodes with. Only the
	// aggregated API's Deployment reads it; no node can.
	ForwarderSecretName = "sandbox-controller-forwarder-ca"
	// ForwarderConfigMapName holds the forwarder CA's certificate, which
	// the nodes trust to name a user.
	ForwarderConfigMapName = "sandbox-controller-forwarder-ca"
	// ConfigMapKey is the key of the certificate in a ConfigMap.
	ConfigMapKey = v1alpha1.ExecCAConfigMapKey
)

// Authority is a CA of the controllers' namespace: the Secret with its
// key and the ConfigMap that publishes its certificate.
type Authority struct {
	Secret, ConfigMap string
	// CommonName is the subject of a CA made for it.
	CommonName string
	// What names it in messages.
	What string
}

var (
	// ExecAPICA signs the nodes' serving certificates; every node's
	// controller reads it.
	ExecAPICA = Authority{Secret: SecretName, ConfigMap: ConfigMapName, CommonName: "sandbox-controller exec API CA", What: "the exec API's CA"}
	// ForwarderCA signs what speaks for users to the nodes; only the
	// aggregated API reads it.
	ForwarderCA = Authority{Secret: ForwarderSecretName, ConfigMap: ForwarderConfigMapName, CommonName: "sandbox-controller forwarder CA", What: "the forwarder CA"}
)

// CAValidity is how long a CA made here is valid. It is not rotated: a
// new one is made by deleting the Secret and restarting the controllers.
const CAValidity = 10 * 365 * 24 * time.Hour

// DefaultValidity is how long a serving certificate is valid; it is
// renewed after two thirds of that.
const DefaultValidity = 7 * 24 * time.Hour

// CA signs serving certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is the certificate, PEM-encoded, as clients get it.
	PEM []byte
}

// NewCA makes an exec API CA valid from now for CAValidity.
func NewCA(now time.Time) (*CA, error) { return newCA(ExecAPICA.CommonName, now) }

// NewForwarderCA makes a forwarder CA valid from now for CAValidity.
func NewForwarderCA(now time.Time) (*CA, error) { return newCA(ForwarderCA.CommonName, now) }

func newCA(cn string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}

// Issue signs a serving certificate for hosts (IP addresses or DNS
// names), valid from now for validity (never past the CA's own end).
func (ca *CA) Issue(hosts []string, validity time.Duration, now time.Time) (*tls.Certificate, error) {
	if len(hosts) == 0 {
		return nil, errors.New("a serving certificate needs at least one address or name")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "sandbox-controller exec API " + hosts[0]},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.sign(tmpl, "serving", validity, now)
}

// ForwarderName is the common name of the client certificate the
// aggregated API presents when it forwards a request that reached it
// through the API server to the node that runs the claim's Sandbox. A node
// takes the caller's identity from the request's headers only from a peer
// whose certificate the forwarder CA signed for this name.
const ForwarderName = "sandbox-controller:forwarder"

// IssueClient signs a client certificate for the common name cn, valid
// from now for validity (never past the CA's own end).
func (ca *CA) IssueClient(cn string, validity time.Duration, now time.Time) (*tls.Certificate, error) {
	if cn == "" {
		return nil, errors.New("a client certificate needs a common name")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.sign(tmpl, "client", validity, now)
}

// sign gives tmpl a fresh key, a serial number and its validity (from a
// little before now, never past the CA's end) and signs it.
func (ca *CA) sign(tmpl *x509.Certificate, what string, validity time.Duration, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if tmpl.SerialNumber, err = serialNumber(); err != nil {
		return nil, err
	}
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-5*time.Minute), now.Add(validity)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing the %s certificate: %w", what, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// Ensure is the CA in a's Secret of namespace, made and stored when
// there is none. Controllers starting at once each try to create it: the
// first create wins and the others read what it stored.
func (a Authority) Ensure(ctx context.Context, c client.Client, namespace string, now time.Time) (*CA, error) {
	key := client.ObjectKey{Namespace: namespace, Name: a.Secret}
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) {
		ca, caErr := newCA(a.CommonName, now)
		if caErr != nil {
			return nil, caErr
		}
		keyDER, keyErr := x509.MarshalPKCS8PrivateKey(ca.Key)
		if keyErr != nil {
			return nil, keyErr
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: a.Secret},
			Type:       corev1.SecretTypeTLS,
			Data: map[string][]byte{
				corev1.TLSCertKey:       ca.PEM,
				corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			},
		}
		switch createErr := c.Create(ctx, &s); {
		case createErr == nil:
			return ca, nil
		case !apierrors.IsAlreadyExists(createErr):
			return nil, fmt.Errorf("storing %s in Secret %s/%s: %w", a.What, namespace, a.Secret, createErr)
		}
		// Another controller made it first: use that one.
		err = c.Get(ctx, key, &s)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s from Secret %s/%s: %w", a.What, namespace, a.Secret, err)
	}
	return a.parse(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
}

func (a Authority) parse(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the Secret %s does not hold a certificate and its key: %w", a.Secret, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, fmt.Errorf("the Secret %s does not hold a CA", a.Secret)
	}
	return &CA{Cert: cert, Key: signer, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

// Publish puts the CA's certificate in a's ConfigMap of namespace, which
// clients read, creating or correcting it.
func (a Authority) Publish(ctx context.Context, c client.Client, namespace string, caPEM []byte) error {
	cm := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: a.ConfigMap}}
	err := c.Get(ctx, client.ObjectKeyFromObject(&cm), &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm.Data = map[string]string{ConfigMapKey: string(caPEM)}
		if err := c.Create(ctx, &cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publishing %s in ConfigMap %s/%s: %w", a.What, namespace, a.ConfigMap, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading ConfigMap %s/%s: %w", namespace, a.ConfigMap, err)
	case bytes.Equal([]byte(cm.Data[ConfigMapKey]), caPEM):
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[ConfigMapKey] = string(caPEM)
	if err := c.Update(ctx, &cm); err != nil {
		return fmt.Errorf("publishing %s in ConfigMap %s/%s: %w", a.What, namespace, a.ConfigMap, err)
	}
	return nil
}

// ReadPublished is a's certificate as clients trust it, from its
// ConfigMap of namespace; found is false when there is none.
func (a Authority) ReadPublished(ctx context.Context, c client.Reader, namespace string) (caPEM []byte, found bool, err error) {
	var cm corev1.ConfigMap
	err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: a.ConfigMap}, &cm)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	caPEM, err = CAOf(&cm)
	return caPEM, err == nil, err
}

// CAOf is the CA certificate a published ConfigMap holds.
func CAOf(cm *corev1.ConfigMap) ([]byte, error) {
	v := cm.Data[ConfigMapKey]
	if v == "" {
		return nil, fmt.Errorf("the ConfigMap %s/%s has no %s", cm.Namespace, cm.Name, ConfigMapKey)
	}
	return []byte(v), nil
}

// Source is a serving certificate of Authority (a node's, of ExecAPICA,
// the zero value; the aggregated API's, of ForwarderCA) and, when
// ClientName is set, a client certificate for that name. Load makes the
// first; Start (a manager Runnable) renews them at two thirds of their
// life, and a renewal that fails is tried again every minute while the
// old ones hold.
type Source struct {
	Client    client.Client
	Namespace string
	Authority Authority
	// ClientName, when set, is the common name of a client certificate
	// issued with the serving one (ForwarderName for the aggregated API).
	ClientName string
	// ReadOnly reads the CA and makes and publishes nothing: a node's
	// controller next to the aggregated API's Deployment, which makes the
	// CAs and which a node may not write for. Load waits for the CA.
	ReadOnly bool
	// Request asks the aggregated API for the certificate (a
	// CertificateSigningRequest of SignerName, signed for Node's name and
	// addresses only) in place of reading the CA: a node's controller
	// never holds the exec API CA's key. The CA's certificate is read from
	// its ConfigMap.
	Request bool
	Node    string
	// Hosts are the addresses and names the certificate is for: the
	// node's exec API address first.
	Hosts    []string
	Validity time.Duration
	Now      func() time.Time
	Log      logr.Logger

	cur    atomic.Pointer[tls.Certificate]
	client atomic.Pointer[tls.Certificate]
	caPEM  atomic.Pointer[[]byte]
}

// Load issues the first certificate, making and publishing the CA if the
// cluster has none.
func (s *Source) Load(ctx context.Context) error {
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Validity <= 0 {
		s.Validity = DefaultValidity
	}
	for {
		err := s.renew(ctx)
		if (!s.ReadOnly && !s.Request) || !errors.Is(err, ErrNoCA) {
			return err
		}
		s.Log.Info("waiting for the aggregated API's Deployment to make the CA", "secret", s.Namespace+"/"+s.authority().Secret)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(2 * time.Second):
		}
	}
}

// ErrNoCA is a CA's Secret that does not exist (yet).
var ErrNoCA = errors.New("no CA yet")

// Read is the CA in a's Secret of namespace; ErrNoCA when there is none.
func (a Authority) Read(ctx context.Context, c client.Reader, namespace string) (*CA, error) {
	var s corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: a.Secret}, &s)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s (Secret %s/%s): %w", a.What, namespace, a.Secret, ErrNoCA)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s from Secret %s/%s: %w", a.What, namespace, a.Secret, err)
	}
	return a.parse(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
}

func (s *Source) authority() Authority {
	if s.Authority.Secret == "" {
		return ExecAPICA
	}
	return s.Authority
}

func (s *Source) renew(ctx context.Context) error {
	if s.Request {
		return s.requestCert(ctx)
	}
	now := s.Now()
	a := s.authority()
	ca, err := s.ca(ctx, a, now)
	if err != nil {
		return err
	}
	cert, err := ca.Issue(s.Hosts, s.Validity, now)
	if err != nil {
		return err
	}
	if s.ClientName != "" {
		clientCert, err := ca.IssueClient(s.ClientName, s.Validity, now)
		if err != nil {
			return err
		}
		s.client.Store(clientCert)
	}
	s.cur.Store(cert)
	s.caPEM.Store(&ca.PEM)
	s.Log.Info("serving certificate issued", "ca", a.What, "hosts", s.Hosts, "notAfter", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// requestCert has the aggregated API sign the node's certificate.
func (s *Source) requestCert(ctx context.Context) error {
	a := s.authority()
	caPEM, found, err := a.ReadPublished(ctx, s.Client, s.Namespace)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%s (ConfigMap %s/%s): %w", a.What, s.Namespace, a.ConfigMap, ErrNoCA)
	}
	cert, err := request(ctx, s.Client, s.Node, s.Hosts, s.Validity)
	if err != nil {
		return err
	}
	s.cur.Store(cert)
	s.caPEM.Store(&caPEM)
	s.Log.Info("serving certificate signed by the aggregated API", "hosts", s.Hosts, "notAfter", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// ca is the Source's CA: read, or made when missing and published.
func (s *Source) ca(ctx context.Context, a Authority, now time.Time) (*CA, error) {
	if s.ReadOnly {
		return a.Read(ctx, s.Client, s.Namespace)
	}
	ca, err := a.Ensure(ctx, s.Client, s.Namespace, now)
	if err != nil {
		return nil, err
	}
	return ca, a.Publish(ctx, s.Client, s.Namespace, ca.PEM)
}

// NeedLeaderElection is false: every node renews its own.
func (s *Source) NeedLeaderElection() bool { return false }

// Start renews the certificate until ctx ends.
func (s *Source) Start(ctx context.Context) error {
	for {
		wait := time.Minute
		if cur := s.cur.Load(); cur != nil {
			life := cur.Leaf.NotAfter.Sub(cur.Leaf.NotBefore)
			wait = max(cur.Leaf.NotBefore.Add(life*2/3).Sub(s.Now()), 0)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		if err := s.renew(ctx); err != nil && ctx.Err() == nil {
			s.Log.Error(err, "renewing the exec API's serving certificate; the current one is served until it expires")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Minute):
			}
		}
	}
}

// GetCertificate serves the current certificate (tls.Config.GetCertificate).
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.cur.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate loaded yet")
}

// GetClientCertificate is the client certificate for ClientName, renewed
// with the serving one (tls.Config.GetClientCertificate).
func (s *Source) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := s.client.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no client certificate loaded yet")
}

// CAPEM is the certificate (PEM) of the Source's CA, nil before Load.
func (s *Source) CAPEM() []byte {
	if p := s.caPEM.Load(); p != nil {
		return *p
	}
	return nil
}

var apiServiceKind = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// PublishAPIService puts the CA's certificate in the caBundle of the
// APIService name, with which the API server verifies the nodes' exec
// APIs when it proxies the aggregated API to them. found is false when
// there is no such APIService (the aggregated API is not installed).
func PublishAPIService(ctx context.Context, c client.Client, name string, caPEM []byte) (found bool, err error) {
	svc := &unstructured.Unstructured{}
	svc.SetGroupVersionKind(apiServiceKind)
	svc.SetName(name)
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"caBundle": base64.StdEncoding.EncodeToString(caPEM)}})
	if err != nil {
		return false, err
	}
	switch err := c.Patch(ctx, svc, client.RawPatch(types.MergePatchType, patch)); {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("setting the caBundle of APIService %s: %w", name, err)
	}
	return true, nil
}

// APIServicePublisher keeps the caBundle of the aggregated API's
// APIService equal to the CA: at start, again after a failure (backing off
// up to Interval), and every Interval. So an APIService applied after the
// controller started, one whose caBundle was cleared, or a first try the
// API server refused all end with an APIService the API server can verify
// the nodes with, without a restart.
type APIServicePublisher struct {
	Client client.Client
	Name   string
	CA     func() []byte
	// Interval is how often the caBundle is checked (default 5 minutes); an
	// APIService that is not there is looked for every 30 seconds or
	// Interval, whichever is shorter.
	Interval time.Duration
	Log      logr.Logger
}

// NeedLeaderElection is false: every node's controller keeps it up.
func (p *APIServicePublisher) NeedLeaderElection() bool { return false }

// Start checks and mends the caBundle until ctx ends.
func (p *APIServicePublisher) Start(ctx context.Context) error {
	interval := p.Interval
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	backoff, said := time.Second, ""
	for {
		wait := interval
		found, changed, err := p.publish(ctx)
		if ctx.Err() != nil {
			// Stopping: a request cut short by that is no failure.
			return nil //nolint:nilerr // as above
		}
		switch {
		case err != nil:
			if said != "failed" {
				p.Log.Error(err, "the API server cannot verify the exec API until the APIService has the CA; trying again", "apiService", p.Name)
			}
			said, wait, backoff = "failed", min(backoff, interval), min(backoff*2, interval)
		case !found:
			if said != "absent" {
				p.Log.Info("no APIService for the aggregated exec API; it is reached on the nodes only until one is installed", "apiService", p.Name)
			}
			said, wait, backoff = "absent", min(30*time.Second, interval), time.Second
		default:
			if changed || said != "" {
				p.Log.Info("the APIService's caBundle is the exec API's CA", "apiService", p.Name)
			}
			said, backoff = "", time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// publish reads the APIService and sets its caBundle when it differs.
func (p *APIServicePublisher) publish(ctx context.Context) (found, changed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	caPEM := p.CA()
	svc := &unstructured.Unstructured{}
	svc.SetGroupVersionKind(apiServiceKind)
	switch err := p.Client.Get(ctx, client.ObjectKey{Name: p.Name}, svc); {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("reading APIService %s: %w", p.Name, err)
	}
	if cur, _, _ := unstructured.NestedString(svc.Object, "spec", "caBundle"); cur == base64.StdEncoding.EncodeToString(caPEM) {
		return true, false, nil
	}
	found, err = PublishAPIService(ctx, p.Client, p.Name, caPEM)
	return found, found && err == nil, err
}
