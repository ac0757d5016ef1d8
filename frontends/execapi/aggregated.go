package execapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
)

// The aggregated API: the API server authenticates and authorises the
// caller, then proxies the request here with the caller's identity in
// request headers, over TLS with its front-proxy client certificate.
const (
	// AggregatedGroup is the API group the APIService registers.
	AggregatedGroup = v1alpha1.SubresourceGroup
	// AggregatedVersion is its only version.
	AggregatedVersion = v1alpha1.SubresourceVersion
	// AggregatedPrefix is the path prefix of the group's version.
	AggregatedPrefix = v1alpha1.SubresourcePrefix
	// APIServiceName is the name of the APIService object.
	APIServiceName = AggregatedVersion + "." + AggregatedGroup
)

// Headers a trusted proxy (the API server, or another node's exec API)
// names the caller in.
const (
	headerRemoteUser   = "X-Remote-User"
	headerRemoteUID    = "X-Remote-Uid"
	headerRemoteGroup  = "X-Remote-Group"
	headerRemoteExtra  = "X-Remote-Extra-"
	authConfigMap      = "extension-apiserver-authentication"
	authConfigMapNS    = "kube-system"
	requestHeaderCAKey = "requestheader-client-ca-file"
	clientCAKey        = "client-ca-file"
)

// The controller reads the API server's front-proxy configuration (the
// RoleBinding to extension-apiserver-authentication-reader in kube-system
// gives it get, list and watch on that ConfigMap; config/rbac).

// via is how a request's caller was authenticated.
type via int

const (
	// viaCredentials: the caller's own token or client certificate.
	viaCredentials via = iota
	// viaFrontProxy: the API server, naming the caller in headers.
	viaFrontProxy
	// viaPeer: another node's exec API forwarding a request that
	// reached it through the API server.
	viaPeer
)

// FrontProxyAuth authenticates requests the API server proxies to the
// aggregated API: a client certificate of the request-header CA with one
// of the allowed names, the user in the configured headers, all read from
// ConfigMap kube-system/extension-apiserver-authentication and kept up to
// date while Auth runs.
func FrontProxyAuth(kube kubernetes.Interface, log logr.Logger, a *Auth) error {
	cm := &kubeauth.ConfigMap{Kube: kube, Namespace: authConfigMapNS, Name: authConfigMap}
	ca := kubeauth.CAFrom("the API server's request-header CA (ConfigMap "+authConfigMapNS+"/"+authConfigMap+")", cm, requestHeaderCAKey, func(err error) {
		log.Error(err, "the request-header CA does not parse; the one before stays")
	})
	names := kubeauth.HeaderNamesFrom(cm, "requestheader-allowed-names", "requestheader-username-headers",
		"requestheader-uid-headers", "requestheader-group-headers", "requestheader-extra-headers-prefix")
	a.FrontProxy = kubeauth.RequestHeader(ca, names)
	// The watch keeps both current; the server waits (a while) for the
	// first read before serving, so the API server's first requests are
	// not refused.
	prev := a.prepare
	a.prepare = func(ctx context.Context) {
		if prev != nil {
			prev(ctx)
		}
		loadCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		// An API server without a front proxy, or a ConfigMap this
		// controller may not read: nothing to wait for.
		_, err := cm.Load(loadCtx)
		go cm.Run(ctx, func(err error) {
			log.V(1).Info("watching the API server's front-proxy configuration", "error", err.Error())
		})
		switch {
		case err != nil:
			log.Error(err, "reading ConfigMap kube-system/"+authConfigMap+" (the RoleBinding to extension-apiserver-authentication-reader of config/aggregated gives it): requests through the API server are refused; nodes' endpoints work")
		case cm.Data()[requestHeaderCAKey] == "":
			log.Info("the API server has no front proxy configured (no " + requestHeaderCAKey + " in ConfigMap kube-system/" + authConfigMap + "): requests through it are refused until it has one; nodes' endpoints work")
		case ca.Pool() == nil:
			log.Info("the request-header CA in ConfigMap kube-system/" + authConfigMap + " does not parse: requests through the API server are refused until it does")
		}
	}
	return nil
}

// PeerAuth authenticates requests the aggregated API forwards: a client
// certificate of the forwarder CA (caPEM, which only the aggregated API's
// Deployment holds the key of; never the exec API's CA, which every node
// holds) for servingcert.ForwarderName, the user in the X-Remote-*
// headers.
func PeerAuth(caPEM []byte, forwarderName string, a *Auth) error {
	ca, err := kubeauth.StaticCA("the forwarder CA", caPEM)
	if err != nil {
		return err
	}
	peerAuthFrom(ca, forwarderName, a)
	return nil
}

// PeerAuthFromConfigMap is PeerAuth with the forwarder CA read from a
// ConfigMap (servingcert.ForwarderConfigMapName) and kept up to date while
// Auth runs: a node trusts what the aggregated API publishes, and nothing
// it could sign itself.
func PeerAuthFromConfigMap(kube kubernetes.Interface, namespace, name, forwarderName string, log logr.Logger, a *Auth) error {
	cm := &kubeauth.ConfigMap{Kube: kube, Namespace: namespace, Name: name}
	ca := kubeauth.CAFrom("the forwarder CA (ConfigMap "+namespace+"/"+name+")", cm, "ca.crt", func(err error) {
		log.Error(err, "the forwarder CA does not parse; the one before stays")
	})
	prev := a.prepare
	a.prepare = func(ctx context.Context) {
		if prev != nil {
			prev(ctx)
		}
		go cm.Run(ctx, func(err error) { log.V(1).Info("watching the forwarder CA", "error", err.Error()) })
		loadCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err := wait.PollUntilContextCancel(loadCtx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
			return ca.Pool() != nil, nil
		})
		if err != nil {
			log.Info("no forwarder CA published yet (ConfigMap " + namespace + "/" + name + ", made by the aggregated API's Deployment): requests through the API server are refused until it appears")
		}
	}
	peerAuthFrom(ca, forwarderName, a)
	return nil
}

func peerAuthFrom(ca *kubeauth.CA, forwarderName string, a *Auth) {
	names := kubeauth.HeaderNames{AllowedNames: []string{forwarderName}, User: []string{headerRemoteUser},
		UID: []string{headerRemoteUID}, Group: []string{headerRemoteGroup}, ExtraPrefixes: []string{headerRemoteExtra}}
	a.Peer = kubeauth.RequestHeader(ca, func() kubeauth.HeaderNames { return names })
}

// Forwarding is how the aggregated API reaches the node that runs a
// claim's Sandbox.
type Forwarding struct {
	// CAPEM verifies the node's serving certificate (the exec API's CA).
	CAPEM []byte
	// GetClientCertificate is the certificate the forwarder presents
	// (servingcert.Source.GetClientCertificate).
	GetClientCertificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
}

func (f *Forwarding) transport() (*http.Transport, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.CAPEM) {
		return nil, errors.New("exec API: forwarding needs the cluster's exec API CA")
	}
	if f.GetClientCertificate == nil {
		return nil, errors.New("exec API: forwarding needs a client certificate")
	}
	return &http.Transport{
		TLSClientConfig: &tls.Config{
			MinVersion:           tls.VersionTLS12,
			RootCAs:              pool,
			GetClientCertificate: f.GetClientCertificate,
			NextProtos:           []string{"http/1.1"},
		},
		// A node that is gone does not hold a request for the kernel's
		// connect timeout (minutes).
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}, nil
}

// transportTo reaches the exec API of node: its serving certificate must
// name the node (the aggregated API signs a node's for its own name
// alone), whatever address the claim's endpoint gives, so a node that
// points another node's claims at itself is not believed. Each node has
// its own transport: a connection verified for one node is never reused
// for another's at the same address.
func (s *Server) transportTo(node string) http.RoundTripper {
	if s.forwardBase == nil {
		return s.forwardTransport
	}
	if t, ok := s.toNode.Load(node); ok {
		return t.(http.RoundTripper)
	}
	t := s.forwardBase.Clone()
	t.TLSClientConfig.ServerName = node
	got, _ := s.toNode.LoadOrStore(node, t)
	return got.(http.RoundTripper)
}

// forward sends a request to the exec API of node, which runs the claim's
// Sandbox (at endpoint, host:port), naming the caller in headers the
// receiving node trusts only from the forwarder's certificate. None of the
// caller's own credentials go along.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, u *kubeauth.User, endpoint, node string) {
	s.metrics.forwarded.Inc()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "https", Host: endpoint})
			setIdentity(pr.Out.Header, u)
		},
		Transport: s.transportTo(node),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.refuse(w, r, u, &apiError{code: http.StatusBadGateway, msg: fmt.Sprintf("forwarding to the exec API of the Sandbox's node at %s: %v", endpoint, err)})
		},
	}
	rp.ServeHTTP(w, r)
}

// setIdentity removes every credential and identity header of h and names u.
func setIdentity(h http.Header, u *kubeauth.User) {
	h.Del("Authorization")
	h.Del("Proxy-Authorization")
	for k := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "x-remote-") || strings.HasPrefix(lk, "impersonate-") {
			delete(h, k)
		}
	}
	// A browser-style websocket carries a bearer token as a subprotocol.
	if ps := h.Values("Sec-WebSocket-Protocol"); len(ps) > 0 {
		var keep []string
		for _, v := range ps {
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, "base64url.bearer.authorization.k8s.io.") {
					keep = append(keep, p)
				}
			}
		}
		h.Del("Sec-WebSocket-Protocol")
		if len(keep) > 0 {
			h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
		}
	}
	h.Set(headerRemoteUser, u.Name)
	if u.UID != "" {
		h.Set(headerRemoteUID, u.UID)
	}
	for _, g := range u.Groups {
		h.Add(headerRemoteGroup, g)
	}
	for k, vs := range u.Extra {
		for _, v := range vs {
			h.Add(headerRemoteExtra+headerKeyEscape(k), v)
		}
	}
}

// headerKeyEscape is an extra's key as a header name may carry it: every
// byte that is not a header token character (RFC 9110), and '%', as %XX,
// which the receiver's path unescaping reads back. url.PathEscape keeps
// ':', '@', '=' and more, which no header name may hold: the request
// could not be sent at all.
func headerKeyEscape(key string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c != '%' && isTokenChar(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// isTokenChar says whether c may be in a header name.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// serveDiscovery answers the API server's discovery of the aggregated
// group, which makes the APIService Available. Discovery names only the
// group's resources; it is served without authentication, as the API
// server's own discovery is to every authenticated user.
func serveDiscovery(w http.ResponseWriter, r *http.Request) {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: AggregatedGroup + "/" + AggregatedVersion, Version: AggregatedVersion}
	group := metav1.APIGroup{
		TypeMeta:         metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
		Name:             AggregatedGroup,
		Versions:         []metav1.GroupVersionForDiscovery{gv},
		PreferredVersion: gv,
	}
	var body any
	switch strings.TrimSuffix(r.URL.Path, "/") {
	case "/apis":
		body = metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{group}}
	case "/apis/" + AggregatedGroup:
		body = group
	case AggregatedPrefix:
		body = metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: gv.GroupVersion,
			APIResources: discoveredResources(),
		}
	default:
		writeStatus(w, &apiError{code: http.StatusNotFound, msg: "no such path: " + r.URL.Path})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// authenticateVia is authenticate with how the caller was authenticated:
// a forwarding peer first, then the API server as front proxy, then the
// caller's own credentials. A request whose X-Remote-* headers come
// without a verified proxy certificate is never taken as that user.
func (s *Server) authenticateVia(r *http.Request) (*kubeauth.User, via, []string) {
	var errs []string
	try := func(a kubeauth.Authenticator) (*kubeauth.User, bool) {
		if a == nil {
			return nil, false
		}
		u, ok, err := a.Authenticate(r)
		if err != nil {
			errs = append(errs, err.Error())
		}
		return u, err == nil && ok && u != nil && u.Name != ""
	}
	if u, ok := try(s.auth.Peer); ok {
		return u, viaPeer, nil
	}
	if u, ok := try(s.auth.FrontProxy); ok {
		return u, viaFrontProxy, nil
	}
	// The caller's own credentials: identity headers mean nothing here.
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-remote-") {
			r.Header.Del(k)
		}
	}
	if u, ok := try(s.auth.Authenticator); ok {
		return u, viaCredentials, nil
	}
	return nil, viaCredentials, errs
}

// discoveredResources are the aggregated API's resources: one per verb of
// a claim the routes serve.
func discoveredResources() []metav1.APIResource {
	out := make([]metav1.APIResource, 0, len(subresources))
	for _, sr := range subresources {
		out = append(out, metav1.APIResource{Name: "sessionclaims/" + sr.name, Namespaced: true, Kind: sr.kind, Verbs: metav1.Verbs(sr.verbs)})
	}
	return out
}
