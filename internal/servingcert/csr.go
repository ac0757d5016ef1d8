package servingcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A node's exec API serving certificate is asked for, not made: the node's
// controller sends a CertificateSigningRequest of SignerName with a key
// that never leaves it, and the aggregated API (Signer), the only holder
// of the exec API CA's key, signs it for that node's name and addresses
// alone. The node is named by its ServiceAccount token, which the API
// server binds to the node its Pod runs on (NodeNameExtra), never by what
// the request says: a taken node can no longer sign a certificate for
// another node's address.

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get

// SignerName is the signer of the nodes' exec API serving certificates.
const SignerName = "sandbox.cireilclaw.dev/exec-api-serving"

// NodeNameExtra is the user extra the API server gives a ServiceAccount
// token bound to a Pod: the node that Pod runs on.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// csrPoll is how often a node looks at its request while it waits.
const csrPoll = 500 * time.Millisecond

// request asks for a serving certificate for hosts, valid for validity,
// through a CertificateSigningRequest named after node, and waits until it
// is signed, denied, or ctx ends.
func request(ctx context.Context, c client.Client, node string, hosts []string, validity time.Duration) (*tls.Certificate, error) {
	if len(hosts) == 0 {
		return nil, errors.New("a serving certificate needs at least one address or name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "sandbox-controller exec API " + hosts[0]}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("making the certificate request: %w", err)
	}
	csr := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "sandbox-exec-api-" + node + "-"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        SignerName,
			Usages:            []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
			ExpirationSeconds: ptr.To(int32(min(validity, maxValidity) / time.Second)),
		},
	}
	if err := c.Create(ctx, csr); err != nil {
		return nil, fmt.Errorf("asking the aggregated API for the exec API's serving certificate (CertificateSigningRequest of %s): %w", SignerName, err)
	}
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(csr), csr); err != nil {
			return nil, fmt.Errorf("reading CertificateSigningRequest %s: %w", csr.Name, err)
		}
		for _, cond := range csr.Status.Conditions {
			if cond.Type == certv1.CertificateDenied || cond.Type == certv1.CertificateFailed {
				return nil, fmt.Errorf("CertificateSigningRequest %s was %s: %s: %s", csr.Name, cond.Type, cond.Reason, cond.Message)
			}
		}
		if len(csr.Status.Certificate) > 0 {
			return parseIssued(csr.Status.Certificate, key)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the aggregated API to sign CertificateSigningRequest %s (is sandbox-controller-api running?): %w", csr.Name, ctx.Err())
		case <-time.After(csrPoll):
		}
	}
}

// maxValidity bounds what a node may ask for.
const maxValidity = 30 * 24 * time.Hour

// parseIssued is the chain a signer issued, with key.
func parseIssued(chain []byte, key *ecdsa.PrivateKey) (*tls.Certificate, error) {
	out := &tls.Certificate{PrivateKey: key}
	for rest := chain; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			out.Certificate = append(out.Certificate, b.Bytes)
		}
	}
	if len(out.Certificate) == 0 {
		return nil, errors.New("the issued certificate holds no CERTIFICATE block")
	}
	leaf, err := x509.ParseCertificate(out.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("reading the issued certificate: %w", err)
	}
	if !leaf.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		return nil, errors.New("the issued certificate is not for this node's key")
	}
	out.Leaf = leaf
	return out, nil
}

// Signer signs the CertificateSigningRequests of SignerName with the exec
// API's CA (the aggregated API's Deployment runs it): only those of the
// nodes' controllers (User, with a token bound to a Pod on node N), for N's
// name and the addresses its Node reports, and nothing else; every other
// is denied, saying which rule it broke.
type Signer struct {
	Client client.Client
	// User is the nodes' controllers' ServiceAccount's user name.
	User string
	CA   *CA
	// Validity bounds what is signed.
	Validity time.Duration
	Now      func() time.Time
}

// The aggregated API's rights to sign (config/aggregated/rbac.yaml, not
// the nodes' Role): read the requests, update their approval and status,
// and approve and sign for SignerName.

// SetupWithManager watches the requests of SignerName. (The package keeps
// to controller-runtime's parts: its root package registers a --kubeconfig
// flag, which the clients that read the CA here must not get.)
func (s *Signer) SetupWithManager(mgr manager.Manager) error {
	return builder.ControllerManagedBy(mgr).Named("csr-signer").
		For(&certv1.CertificateSigningRequest{}).
		WithEventFilter(signerOnly{}).
		Complete(s)
}

// Reconcile approves and signs one request, or denies it.
func (s *Signer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var csr certv1.CertificateSigningRequest
	if err := s.Client.Get(ctx, req.NamespacedName, &csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != SignerName || len(csr.Status.Certificate) > 0 || decided(&csr, certv1.CertificateDenied) || decided(&csr, certv1.CertificateFailed) {
		return reconcile.Result{}, nil
	}
	var node *corev1.Node
	var others []corev1.Node
	if names := csr.Spec.Extra[NodeNameExtra]; len(names) == 1 {
		var nodes corev1.NodeList
		if err := s.Client.List(ctx, &nodes); err != nil {
			return reconcile.Result{}, err
		}
		for i := range nodes.Items {
			if nodes.Items[i].Name == names[0] {
				node = &nodes.Items[i]
			} else {
				others = append(others, nodes.Items[i])
			}
		}
	}
	cr, err := CheckRequest(&csr, s.User, node, others...)
	if err != nil {
		log.FromContext(ctx).Info("refused a certificate request", "csr", csr.Name, "user", csr.Spec.Username, "reason", err.Error())
		if decided(&csr, certv1.CertificateApproved) {
			// Approved by an earlier pass (the Node changed since): an
			// approved request can no longer be denied, only fail.
			csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
				Type: certv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: "NotANodesOwn", Message: err.Error(), LastUpdateTime: metav1.Now()})
			return reconcile.Result{}, s.Client.Status().Update(ctx, &csr)
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type: certv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "NotANodesOwn", Message: err.Error(), LastUpdateTime: metav1.Now()})
		return reconcile.Result{}, s.Client.SubResource("approval").Update(ctx, &csr)
	}
	if !decided(&csr, certv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "NodesOwnAddresses",
			Message: "the exec API serving certificate of node " + node.Name + ", for its own name and addresses", LastUpdateTime: metav1.Now()})
		if err := s.Client.SubResource("approval").Update(ctx, &csr); err != nil {
			return reconcile.Result{}, err
		}
	}
	validity := min(s.Validity, MaxNodeValidity)
	if e := csr.Spec.ExpirationSeconds; e != nil && time.Duration(*e)*time.Second < validity {
		validity = time.Duration(*e) * time.Second
	}
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	signed, err := s.CA.signRequest(cr, node.Name, validity, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	csr.Status.Certificate = signed
	if err := s.Client.Status().Update(ctx, &csr); err != nil {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("signed a node's exec API serving certificate", "csr", csr.Name, "node", node.Name)
	return reconcile.Result{}, nil
}

func decided(csr *certv1.CertificateSigningRequest, t certv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// MaxNodeValidity bounds a node's serving certificate, which nothing
// revokes: a node deleted, or an address given to another machine, is
// believed at most this long after.
const MaxNodeValidity = 24 * time.Hour

// CheckRequest is the request csr carries when it is a node's controller's
// (user, its token bound to a Pod on node) for a serving certificate of
// that node's name and addresses, and an error naming the broken rule
// otherwise. node is the Node its token names; nil when it names none or
// one that does not exist. An address one of the others reports too is
// refused: a Node's addresses are its kubelet's word, and a taken node's
// kubelet could add another's.
func CheckRequest(csr *certv1.CertificateSigningRequest, user string, node *corev1.Node, others ...corev1.Node) (*x509.CertificateRequest, error) {
	if csr.Spec.Username != user {
		return nil, fmt.Errorf("signer %s signs only for the nodes' controllers (%s), not %s", SignerName, user, csr.Spec.Username)
	}
	names := csr.Spec.Extra[NodeNameExtra]
	if len(names) != 1 {
		return nil, fmt.Errorf("the request's credentials name no node (extra %s): it must come from a token bound to the controller's pod", NodeNameExtra)
	}
	if node == nil || node.Name != names[0] {
		return nil, fmt.Errorf("node %s, which the request's credentials name, does not exist", names[0])
	}
	for _, u := range csr.Spec.Usages {
		if u != certv1.UsageDigitalSignature && u != certv1.UsageKeyEncipherment && u != certv1.UsageServerAuth {
			return nil, fmt.Errorf("usage %q: a serving certificate is for digital signature, key encipherment and server auth only", u)
		}
	}
	if !slices.Contains(csr.Spec.Usages, certv1.UsageServerAuth) {
		return nil, errors.New("usages: a serving certificate needs server auth")
	}
	b, _ := pem.Decode(csr.Spec.Request)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("request: no PEM CERTIFICATE REQUEST")
	}
	cr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if err := cr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("request: its signature: %w", err)
	}
	if len(cr.EmailAddresses) > 0 || len(cr.URIs) > 0 {
		return nil, errors.New("request: a serving certificate names addresses and the node's name only, no e-mail address or URI")
	}
	if len(cr.IPAddresses) == 0 && len(cr.DNSNames) == 0 {
		return nil, errors.New("request: names no address or name")
	}
	for _, d := range cr.DNSNames {
		if d != node.Name {
			return nil, fmt.Errorf("request: DNS name %q is not node %s's name", d, node.Name)
		}
	}
	for _, ip := range cr.IPAddresses {
		if !nodeHasAddress(node, ip) {
			return nil, fmt.Errorf("request: address %s is not one node %s reports (status.addresses)", ip, node.Name)
		}
		for i := range others {
			if nodeHasAddress(&others[i], ip) {
				return nil, fmt.Errorf("request: address %s is reported by node %s too", ip, others[i].Name)
			}
		}
	}
	return cr, nil
}

// nodeHasAddress says whether node reports ip as its internal or external
// address.
func nodeHasAddress(node *corev1.Node, ip net.IP) bool {
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if got := net.ParseIP(a.Address); got != nil && got.Equal(ip) {
			return true
		}
	}
	return false
}

// signRequest signs the serving certificate cr asks for node, for its
// key, valid from now for validity (never past the CA's own end), as PEM:
// the certificate, then the CA's. Only the checked names and addresses
// come from the request; the subject names the node.
func (ca *CA) signRequest(cr *x509.CertificateRequest, node string, validity time.Duration, now time.Time) ([]byte, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "sandbox-controller exec API " + node},
		IPAddresses:  cr.IPAddresses,
		DNSNames:     cr.DNSNames,
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, cr.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing the node's serving certificate: %w", err)
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.PEM...), nil
}

// signerOnly passes the events of requests of SignerName.
type signerOnly struct{}

func (signerOnly) Create(e event.CreateEvent) bool   { return isOurs(e.Object) }
func (signerOnly) Update(e event.UpdateEvent) bool   { return isOurs(e.ObjectNew) }
func (signerOnly) Delete(event.DeleteEvent) bool     { return false }
func (signerOnly) Generic(e event.GenericEvent) bool { return isOurs(e.Object) }

func isOurs(o client.Object) bool {
	csr, ok := o.(*certv1.CertificateSigningRequest)
	return ok && csr.Spec.SignerName == SignerName
}
