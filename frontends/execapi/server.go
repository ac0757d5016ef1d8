package execapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Options are what the server works with besides its Config.
type Options struct {
	// Reader reads SessionClaims and Sandboxes (the manager's client).
	Reader client.Reader
	// Runtimes are the drivers of the enabled backends, the controllers' own.
	Runtimes map[v1alpha1.Backend]runtimes.Runtime
	// Host gives the areas root and home directory, as for the controllers.
	Host instance.Host
	// NodeName is the node this controller serves; claims whose Sandbox
	// names another node are refused.
	NodeName string
	// Auth authenticates and authorises requests (DelegatingAuth).
	Auth Auth
	// Registerer takes the metrics; nil means controller-runtime's registry,
	// served on the manager's metrics endpoint.
	Registerer prometheus.Registerer
	// Log receives refused requests and server errors.
	Log logr.Logger
	// GetCertificate serves the certificate of each TLS handshake
	// (servingcert.Source); nil means Config's certificate files.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Forwarding, when set, sends a request that reached this server
	// through the API server on to the node that runs the claim's Sandbox;
	// without it such a request is answered 421 as a direct one is.
	Forwarding *Forwarding
	// ForwardOnly makes the server the aggregated API's own (its
	// Deployment, not a node): it runs nothing and reads no agent's areas,
	// and forwards every request that reaches it through the API server
	// to the node of the claim's Sandbox. It needs Forwarding.
	ForwardOnly bool
	// ForwardUnplaced forwards a request for a Sandbox placed on no node
	// to the endpoint in its claim's status, whose certificate is then
	// verified for that endpoint's address alone. Only for one controller
	// serving without a node name behind this server: on a cluster every
	// Sandbox a node serves is placed, and any node's controller can write
	// a claim's endpoint, so without it such a request is refused.
	ForwardUnplaced bool
}

// Server is the exec and file API. It is a manager.Runnable that runs on
// every replica (it does not need the leader lease).
type Server struct {
	cfg     Config
	opts    Options
	auth    Auth
	log     logr.Logger
	metrics *metrics
	execs   *claimLimiter
	uploads *uploadSlots
	// downloads bounds the file downloads, listings and MCP requests
	// being answered.
	downloads *uploadSlots
	handler   http.Handler
	// forwardTransport reaches other nodes' exec APIs (Options.Forwarding);
	// forwardBase, when set, is what the transport to each node is made
	// from (transportTo), one per node name, which the node's serving
	// certificate must carry.
	forwardTransport http.RoundTripper
	forwardBase      *http.Transport
	toNode           sync.Map

	// idleTimeout closes a kept-alive connection that sends no next
	// request (DefaultIdleTimeout).
	idleTimeout time.Duration
	// downloadWriteTimeout bounds the wait for one write of a file's
	// contents to leave (frameWriteTimeout).
	downloadWriteTimeout time.Duration

	mu sync.Mutex
	ln net.Listener
}

// DefaultIdleTimeout is how long a kept-alive connection may wait for its
// next request. Without it anyone who can reach the port, authenticated or
// not, held as many connections as it liked open forever, each with its
// goroutine and buffers: one answer (a 401 will do) and then silence.
const DefaultIdleTimeout = 2 * time.Minute

// New builds the server; Start serves it.
func New(cfg Config, opts Options) (*Server, error) {
	cfg = cfg.withDefaults()
	if opts.Reader == nil {
		return nil, errors.New("exec API: no client to read SessionClaims with")
	}
	if opts.Auth.Authenticator == nil || opts.Auth.Authorizer == nil {
		return nil, errors.New("exec API: authentication and authorisation are required (see DelegatingAuth)")
	}
	reg := opts.Registerer
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("exec API: registering metrics: %w", err)
	}
	s := &Server{cfg: cfg, opts: opts, auth: opts.Auth, log: opts.Log, metrics: m, execs: newClaimLimiter(cfg.MaxExecsPerClaim), uploads: newUploadSlots(cfg.MaxUploads), downloads: newUploadSlots(cfg.MaxDownloads), idleTimeout: DefaultIdleTimeout, downloadWriteTimeout: frameWriteTimeout}
	if opts.ForwardOnly && opts.Forwarding == nil {
		return nil, errors.New("exec API: serving the aggregated API only needs forwarding to the nodes")
	}
	if opts.Forwarding != nil {
		if s.forwardBase, err = opts.Forwarding.transport(); err != nil {
			return nil, err
		}
		s.forwardTransport = s.forwardBase
	}
	s.handler = s.routes()
	return s, nil
}

// forwards reports whether a request refused with e is to be forwarded:
// it reached this node through the API server (never from a peer, so a
// request is forwarded at most once), and its Sandbox's node publishes an
// endpoint.
func (s *Server) forwards(how via, e *apiError) bool {
	return s.forwardTransport != nil && how == viaFrontProxy && e.code == http.StatusMisdirectedRequest && e.endpoint != ""
}

const (
	claimPath           = "/api/v1alpha1/namespaces/{namespace}/sessionclaims/{name}"
	aggregatedClaimPath = AggregatedPrefix + "/namespaces/{namespace}/sessionclaims/{name}"
)

// subresource is one verb of a claim the exec API serves: its paths below
// the claim (under both prefixes) and what the aggregated API's discovery
// says of it.
type subresource struct {
	name, kind string
	verbs      []string
	paths      []string
	handler    func(*Server) http.HandlerFunc
}

// subresources are every verb of a claim; the routes and the discovery
// document are both made from this list.
var subresources = []subresource{
	{name: "exec", kind: "SessionClaimExec", verbs: []string{"get", "create"}, paths: []string{"/exec"},
		handler: func(s *Server) http.HandlerFunc { return s.serveExec }},
	{name: "files", kind: "SessionClaimFiles", verbs: []string{"get", "update", "delete"}, paths: []string{"/files/{area}", "/files/{area}/{path...}"},
		handler: func(s *Server) http.HandlerFunc { return s.serveFiles }},
	{name: "mcp", kind: "SessionClaimMCP", verbs: []string{"get", "create"}, paths: []string{"/mcp"},
		handler: func(s *Server) http.HandlerFunc { return s.serveMCP }},
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	// Each verb on a node's own paths and under the aggregated API's.
	for _, sr := range subresources {
		for _, p := range sr.paths {
			mux.HandleFunc(claimPath+p, sr.handler(s))
			mux.HandleFunc(aggregatedClaimPath+p, sr.handler(s))
		}
	}
	mux.HandleFunc("GET /apis", serveDiscovery)
	mux.HandleFunc("GET /apis/{$}", serveDiscovery)
	mux.HandleFunc("GET /apis/"+AggregatedGroup, serveDiscovery)
	mux.HandleFunc("GET /apis/"+AggregatedGroup+"/{$}", serveDiscovery)
	mux.HandleFunc("GET "+AggregatedPrefix, serveDiscovery)
	mux.HandleFunc("GET "+AggregatedPrefix+"/{$}", serveDiscovery)
	return mux
}

// Handler is the API without TLS, for tests that bring their own listener.
func (s *Server) Handler() http.Handler { return s.handler }

// Listen binds the address (once) and returns it; Start calls it too.
func (s *Server) Listen() (net.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return s.ln.Addr(), nil
	}
	tlsCfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.opts.GetCertificate,
		// The certificate is verified by the authenticator against the
		// client CA; a caller with a bearer token sends none.
		ClientAuth: tls.RequestClientCert,
		NextProtos: []string{"http/1.1"},
	}
	if s.opts.GetCertificate == nil {
		if err := s.cfg.validate(); err != nil {
			return nil, err
		}
		cert, err := tls.LoadX509KeyPair(s.cfg.CertFile, s.cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("exec API: loading the serving certificate: %w", err)
		}
		tlsCfg.Certificates = []tls.Certificate{cert}
	}
	ln, err := net.Listen("tcp", s.cfg.BindAddress)
	if err != nil {
		return nil, fmt.Errorf("exec API: listening on %s: %w", s.cfg.BindAddress, err)
	}
	s.ln = tls.NewListener(ln, tlsCfg)
	return s.ln.Addr(), nil
}

// Start serves until ctx ends. Running commands are killed then: their
// contexts derive from ctx.
func (s *Server) Start(ctx context.Context) error {
	addr, err := s.Listen()
	if err != nil {
		return err
	}
	if s.auth.prepare != nil {
		s.auth.prepare(ctx)
	}
	if s.auth.run != nil {
		go s.auth.run(ctx)
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       s.idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(s.ln) }()
	s.log.Info("serving the exec and file API", "address", addr.String())
	select {
	case err := <-done:
		return fmt.Errorf("exec API: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("exec API: shutting down: %w", err)
	}
	return nil
}

// NeedLeaderElection is false: every replica serves the claims of its node.
func (s *Server) NeedLeaderElection() bool { return false }
