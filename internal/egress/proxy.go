package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// Resolver finds the addresses of a name (net.Resolver is one).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Decision is what the proxy did with one request, for metrics and
// Events. It names the host the request asked for and never anything of
// its contents.
type Decision struct {
	Host    string
	Port    int
	Allowed bool
	// Reason says why a request was refused.
	Reason string
}

// Defaults of a Proxy.
const (
	DefaultMaxConns    = 256
	DefaultIdleTimeout = 5 * time.Minute
	// dialTimeout bounds a request's lookup and connection together,
	// every address tried included.
	dialTimeout = 15 * time.Second
	// maxDialAddrs bounds the addresses a request tries: a name may
	// resolve to thousands that drop SYNs, and the connection holds its
	// slots while they are tried.
	maxDialAddrs = 4
	// helloTimeout bounds how long a client may take to send its TLS
	// ClientHello after CONNECT.
	helloTimeout = 15 * time.Second
	// maxHello bounds the bytes read looking for a ClientHello.
	maxHello = 16 << 10
)

// Proxy serves one Sandbox's egress on a listener: HTTP CONNECT (any TCP
// stream, TLS checked for its server name) and plain HTTP requests in
// absolute form. Every request is held to Policy before anything is
// dialled, and dialled at an address the proxy resolved and checked
// itself, so a name that resolves differently later changes nothing.
type Proxy struct {
	Policy Policy
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver Resolver
	// MaxConns bounds the connections served at once; more are refused.
	MaxConns int
	// IdleTimeout closes a connection that moved no byte this long.
	IdleTimeout time.Duration
	// BytesPerSecond bounds what all the proxy's connections move
	// together, each way; zero: no bound.
	BytesPerSecond int64
	// OnDecision, when set, hears of every request.
	OnDecision func(Decision)
	// HelloTimeout bounds how long a tunnel's client may take to send its
	// first bytes (a TLS ClientHello); zero: 15 seconds.
	HelloTimeout time.Duration
	// DialTimeout bounds a request's lookup and connection together, all
	// the addresses tried; zero: 15 seconds.
	DialTimeout time.Duration
	// Shared, when set, bounds the connections this proxy serves together
	// with every other proxy given the same Shared: one per connection,
	// taken as MaxConns's is. Each connection holds two descriptors and a
	// few goroutines of the controller, not of the Sandbox, so many
	// Sandboxes at their own bound would run the controller out of them.
	Shared *Slots
	// Tenant is the namespace of the Sandbox the proxy serves: the
	// proxies of one tenant hold together at most its share of Shared.
	Tenant string

	once  sync.Once
	slots chan struct{}
	live  atomic.Pointer[Policy]
	// ctx ends with Stop; every dial is derived from it.
	ctx  context.Context
	stop context.CancelFunc
	// tunnels are the open tunnels and the dials under way, for SetPolicy.
	tunnelsMu sync.Mutex
	tunnels   map[*openTunnel]struct{}
	// up and down share BytesPerSecond among the connections, towards
	// the destinations and towards the Sandbox.
	up, down *rate.Limiter
}

// SetPolicy replaces Policy for the requests that come after it, while
// the proxy serves, and closes the open tunnels and cancels the dials it
// no longer allows.
func (p *Proxy) SetPolicy(pol Policy) {
	p.live.Store(&pol)
	p.tunnelsMu.Lock()
	defer p.tunnelsMu.Unlock()
	for t := range p.tunnels {
		if t.refusedBy(pol) {
			t.end()
		}
	}
}

// Stop ends everything the proxy serves: its policy becomes one that
// allows nothing, which closes the open tunnels and plain requests, and
// the dials under way are cancelled. Requests after it are refused. The
// listener is the caller's to close.
func (p *Proxy) Stop() {
	p.init()
	p.stop()
	p.SetPolicy(Policy{})
}

// openTunnel is a tunnel being spliced, or a dial under way: where it
// goes and how it is ended when a new policy refuses it.
type openTunnel struct {
	host string
	port int
	// addr is the address connected to; a dial has none yet.
	addr    netip.Addr
	dialing bool
	end     func()
}

// refusedBy says whether pol no longer allows t.
func (t *openTunnel) refusedBy(pol Policy) bool {
	return !pol.Allows(t.host, t.port) || (!t.dialing && !pol.Reachable(t.addr))
}

// track adds t to the open tunnels until the returned function is
// called.
func (p *Proxy) track(t *openTunnel) func() {
	p.tunnelsMu.Lock()
	if p.tunnels == nil {
		p.tunnels = map[*openTunnel]struct{}{}
	}
	p.tunnels[t] = struct{}{}
	p.tunnelsMu.Unlock()
	return func() {
		p.tunnelsMu.Lock()
		delete(p.tunnels, t)
		p.tunnelsMu.Unlock()
	}
}

// policy is the policy a request is held to now.
func (p *Proxy) policy() Policy {
	if pol := p.live.Load(); pol != nil {
		return *pol
	}
	return p.Policy
}

func (p *Proxy) init() {
	p.once.Do(func() {
		if p.MaxConns <= 0 {
			p.MaxConns = DefaultMaxConns
		}
		if p.IdleTimeout <= 0 {
			p.IdleTimeout = DefaultIdleTimeout
		}
		if p.HelloTimeout <= 0 {
			p.HelloTimeout = helloTimeout
		}
		if p.DialTimeout <= 0 {
			p.DialTimeout = dialTimeout
		}
		p.ctx, p.stop = context.WithCancel(context.Background())
		if p.Resolver == nil {
			p.Resolver = net.DefaultResolver
		}
		p.slots = make(chan struct{}, p.MaxConns)
		if p.BytesPerSecond > 0 {
			p.up = rate.NewLimiter(rate.Limit(p.BytesPerSecond), int(min(p.BytesPerSecond, maxBurst)))
			p.down = rate.NewLimiter(rate.Limit(p.BytesPerSecond), int(min(p.BytesPerSecond, maxBurst)))
		}
	})
}

// Serve answers connections on l until it is closed.
func (p *Proxy) Serve(l net.Listener) error {
	p.init()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors or buffers: wait and go on serving, or
			// the Sandbox would lose its way out until a restart.
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		select {
		case p.slots <- struct{}{}:
		default:
			p.decide(Decision{Reason: "too many connections"})
			_ = c.Close()
			continue
		}
		if err := p.Shared.take(p.Tenant); err != nil {
			<-p.slots
			p.decide(Decision{Reason: err.Error()})
			_ = c.Close()
			continue
		}
		go func() {
			defer func() { <-p.slots; p.Shared.give(p.Tenant) }()
			p.serveConn(c)
		}()
	}
}

// Slots bound connections across proxies (Proxy.Shared), and those of
// any one tenant to three quarters of them: each connection holds the
// controller's descriptors, and one tenant's Sandboxes at their own
// bound would otherwise take every other tenant's way out with them. The
// last quarter goes to tenants holding fewer than are free, so a few
// tenants together cannot take it all either.
type Slots struct {
	max, share int

	mu       sync.Mutex
	taken    int
	byTenant map[string]int
}

// NewSlots is a bound of n connections; nil (no bound) when n <= 0.
func NewSlots(n int) *Slots {
	if n <= 0 {
		return nil
	}
	return &Slots{max: n, share: tenantShare(n), byTenant: map[string]int{}}
}

// tenantShare is the most connections one tenant may hold out of n: all
// but a quarter, which stays for the other tenants (and at least one).
func tenantShare(n int) int { return max(1, n-n/4) }

// take takes a slot for tenant, or says which bound is reached.
func (s *Slots) take(tenant string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.taken >= s.max:
		return fmt.Errorf("too many connections on this node: the egress proxies of all its Sandboxes serve at most %d at once (--egress-max-connections-total)", s.max)
	case s.byTenant[tenant] >= s.share:
		return fmt.Errorf("namespace %s has %d connections open through its Sandboxes' egress proxies, the most one namespace may have on this node (--egress-max-connections-total %d less a quarter kept for other namespaces)", tenant, s.share, s.max)
	case s.max-s.taken <= s.max-s.share && s.byTenant[tenant] >= s.max-s.taken:
		// The last quarter goes to namespaces holding fewer than are
		// free: one holding none always gets the last, and the ones
		// holding some halve what is left at most, so two or three
		// namespaces together do not take every other's way out.
		return fmt.Errorf("namespace %s has %d connections open through its Sandboxes' egress proxies and only %d of this node's %d are free: the last quarter goes to namespaces holding fewer than are free (--egress-max-connections-total)", tenant, s.byTenant[tenant], s.max-s.taken, s.max)
	}
	s.taken++
	s.byTenant[tenant]++
	return nil
}

// give gives back a slot tenant took.
func (s *Slots) give(tenant string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taken--
	if s.byTenant[tenant]--; s.byTenant[tenant] <= 0 {
		delete(s.byTenant, tenant)
	}
}

func (p *Proxy) decide(d Decision) {
	if p.OnDecision != nil {
		p.OnDecision(d)
	}
}

// refusal is a request refused, with the status the client is answered.
type refusal struct {
	code int
	msg  string
}

func (r *refusal) Error() string { return r.msg }

func refuse(code int, format string, args ...any) error {
	return &refusal{code: code, msg: fmt.Sprintf(format, args...)}
}

// serveConn reads one request from c: a CONNECT tunnels, a plain HTTP
// request is forwarded and the connection closed after its answer.
func (p *Proxy) serveConn(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	// The request's head is bounded; what follows it (a body, a tunnel's
	// stream) is not.
	head := &capReader{r: c, left: maxHello}
	br := bufio.NewReader(head)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	head.left = -1
	_ = c.SetReadDeadline(time.Time{})
	if req.Method == http.MethodConnect {
		p.tunnel(c, br, req)
		return
	}
	p.forward(c, br, req)
}

// dialFor is dial for the client on c, whose next bytes br reads: the
// dial is cancelled when the proxy stops or the client leaves while it is
// under way, so a client gone gives its slots back at once.
func (p *Proxy) dialFor(c net.Conn, br *bufio.Reader, host string, port int) (net.Conn, error) {
	ctx, cancel := context.WithCancelCause(p.ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	dialled := make(chan struct{})
	go func() {
		defer close(watched)
		// Peeked bytes stay for the tunnel or the request's body.
		if _, err := br.Peek(1); err != nil {
			cancel(errClientLeft)
			return
		}
		// The client sent more than its request's head (a TLS hello, a
		// body): those bytes wait unread, and its socket is watched for
		// its end instead.
		if hungUp(c, dialled) {
			cancel(errClientLeft)
		}
	}()
	up, err := p.dial(ctx, host, port)
	close(dialled)
	// Wake the watcher and wait for it: br is not read by two at once.
	_ = c.SetReadDeadline(time.Now())
	<-watched
	_ = c.SetReadDeadline(time.Time{})
	return up, err
}

// hangupPoll is how often a client that sent more than its request's head
// is looked at while its dial is under way.
const hangupPoll = 100 * time.Millisecond

// Why a dial was cancelled.
var (
	errClientLeft    = errors.New("the client closed its connection")
	errPolicyRefuses = errors.New("the Sandbox's egress policy changed and no longer allows it")
	errDialTimeout   = errors.New("no address answered in time")
)

// dial resolves host, holds every address to the policy and dials the
// first one that answers, trying at most maxDialAddrs within DialTimeout.
// It never dials a name: what was checked is what is dialled. A new
// policy that refuses host cancels it.
func (p *Proxy) dial(ctx context.Context, host string, port int) (net.Conn, error) {
	if err := checkRequestHost(host); err != nil {
		return nil, refuse(http.StatusBadRequest, "%v", err)
	}
	ctx, timeout := context.WithTimeoutCause(ctx, p.DialTimeout, errDialTimeout)
	defer timeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Tracked before the policy is read: a policy set after the read
	// sees the dial.
	defer p.track(&openTunnel{host: host, port: port, dialing: true, end: func() { cancel(errPolicyRefuses) }})()
	pol := p.policy()
	if !pol.Allows(host, port) {
		return nil, refuse(http.StatusForbidden, "%s:%d is not in the Sandbox's egress allowlist", host, port)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		// The name as it is, never below a search domain: the host's
		// resolver (a cluster's, say) would try github.com.<namespace>.svc
		// first, a name a tenant may own.
		addrs, err = p.Resolver.LookupNetIP(ctx, "ip", host+".")
		if err != nil || len(addrs) == 0 {
			return nil, refuse(http.StatusBadGateway, "%s does not resolve", host)
		}
	}
	reachable, node := reachableAddrs(pol, addrs)
	switch {
	case len(reachable) > 0:
	case node.IsValid():
		return nil, refuseNode(host, node)
	default:
		return nil, refuse(http.StatusForbidden, "%s resolves only to internal addresses, which the Sandbox may not reach", host)
	}
	reachable = reachable[:min(len(reachable), maxDialAddrs)]
	var last error
	for i, a := range reachable {
		// Each address gets its share of the time left, as net.Dialer
		// shares a deadline among a name's addresses: one that drops SYNs
		// leaves time for the next.
		deadline, _ := ctx.Deadline()
		actx, done := context.WithTimeout(ctx, time.Until(deadline)/time.Duration(len(reachable)-i))
		var d net.Dialer
		if pol.NodeRoutes {
			d.Control = refuseRoutedToHost
		}
		conn, err := d.DialContext(actx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		done()
		if err == nil {
			return conn, nil
		}
		if errors.Is(err, errRoutedToHost) {
			return nil, refuseNode(host, a)
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errPolicyRefuses):
		return nil, refuse(http.StatusForbidden, "connecting to %s:%d: %v", host, port, cause)
	case cause != nil:
		return nil, refuse(http.StatusBadGateway, "connecting to %s:%d: %v", host, port, cause)
	}
	return nil, refuse(http.StatusBadGateway, "connecting to %s:%d: %v", host, port, last)
}

// refuseNode is the refusal of host, which is or resolves to node, an
// address of this node.
func refuseNode(host string, node netip.Addr) error {
	if node.String() == host {
		return refuse(http.StatusForbidden, "%s is this node's own address, which the egress proxy never connects to: a SandboxClass's allowedEgressNetworks does not open the node", host)
	}
	return refuse(http.StatusForbidden, "%s resolves to %s, this node's own address, which the egress proxy never connects to: a SandboxClass's allowedEgressNetworks does not open the node", host, node)
}

// errRoutedToHost: the kernel routes the address dialled to this host.
var errRoutedToHost = errors.New("the kernel routes this address to this node itself")

// refuseRoutedToHost is a dialer's check of the address it is about to
// connect to, after every policy check: the node's addresses as the kernel
// knows them now, not as they were when the proxy started.
func refuseRoutedToHost(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("the address to connect to, %q: %w", address, err)
	}
	local, err := routedToHost(ap.Addr())
	if err != nil {
		return err
	}
	if local {
		return errRoutedToHost
	}
	return nil
}

// reachableAddrs are the addresses of addrs pol lets a connection go to,
// and the first of the node's own among the others (none when there is
// none), for the refusal to name.
func reachableAddrs(pol Policy, addrs []netip.Addr) (reachable []netip.Addr, node netip.Addr) {
	for _, a := range addrs {
		switch pol.reach(a) {
		case addrReachable:
			reachable = append(reachable, a)
		case addrOfNode:
			if !node.IsValid() {
				node = a.Unmap()
			}
		}
	}
	return reachable, node
}

// tunnel serves a CONNECT: the destination is checked and dialled, the
// client told so, and a TLS stream's server name held to the host named.
func (p *Proxy) tunnel(c net.Conn, br *bufio.Reader, req *http.Request) {
	host, port, err := splitHostPort(req.Host, 0)
	if err == nil {
		err = checkRequestHost(host)
	}
	if err != nil {
		p.answer(c, Decision{Reason: err.Error()}, refuse(http.StatusBadRequest, "%v", err))
		return
	}
	d := Decision{Host: host, Port: port}
	up, err := p.dialFor(c, br, host, port)
	if err != nil {
		p.answer(c, d, err)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// What the client sends first: a TLS ClientHello must name host. A
	// client that sends nothing in time is not let through unchecked (it
	// could send a ClientHello for another name later), and a tunnel to
	// the web's ports must carry TLS: plain HTTP inside one would name its
	// host in a header the proxy never reads (plain requests are sent to
	// the proxy itself, which reads it).
	_ = c.SetReadDeadline(time.Now().Add(p.HelloTimeout))
	first, hello, isTLS, err := peekHello(br)
	name := hello.name
	_ = c.SetReadDeadline(time.Time{})
	switch {
	case err != nil:
		d.Reason = fmt.Sprintf("the client sent nothing the proxy could check within %s", p.HelloTimeout)
		p.decide(d)
		return
	case isTLS && !hello.read:
		// Its server name is unknown, not absent: the tunnel's server
		// may read the hello and serve the name in it.
		d.Reason = fmt.Sprintf("the TLS ClientHello could not be read within its first %d bytes", maxHello)
		p.decide(d)
		return
	case isTLS && hello.encryptedName:
		// The outer ClientHello may name the allowed host while the inner
		// one, which a server of the same provider decrypts and serves,
		// names another.
		d.Reason = "the TLS ClientHello hides the server name it asks for (Encrypted Client Hello); the proxy lets through only a name it can read"
		p.decide(d)
		return
	case isTLS && !serverNameFits(name, host):
		d.Reason = fmt.Sprintf("TLS server name %s is not the host %s the tunnel was opened for", clip(name), host)
		p.decide(d)
		return
	case !isTLS && (port == 443 || port == 80):
		d.Reason = fmt.Sprintf("a tunnel to port %d must carry TLS", port)
		p.decide(d)
		return
	}
	d.Allowed = true
	p.decide(d)
	if _, err := up.Write(first); err != nil {
		return
	}
	ctx, t := p.opened(host, port, c, up)
	defer t.end()
	defer p.track(t)()
	// A policy set between the check and now has not seen this tunnel.
	if t.refusedBy(p.policy()) {
		return
	}
	p.splice(ctx, c, br, up)
}

// opened is the open tunnel (or plain request) from c to up, for host and
// port, and a context that ends with it: ending it closes both
// connections and cancels a wait for the bandwidth bound, so nothing
// blocked in a write (to a destination that stopped reading, say) holds
// its slots on. The caller ends it when it is done.
func (p *Proxy) opened(host string, port int, c, up net.Conn) (context.Context, *openTunnel) {
	addr, _ := netip.ParseAddrPort(up.RemoteAddr().String())
	ctx, cancel := context.WithCancel(p.ctx)
	return ctx, &openTunnel{host: host, port: port, addr: addr.Addr().Unmap(), end: func() {
		cancel()
		_ = c.Close()
		_ = up.Close()
	}}
}

// checkRequestHost says whether host, as a request named it, is a name or
// an address a rule could allow: nothing else reaches the policy, the
// resolver, the metrics or an Event, and the error quotes no more of it
// than clip keeps.
func checkRequestHost(host string) error {
	if strings.Contains(host, "*") || CheckRule(Rule{Host: host}) != nil {
		return fmt.Errorf("%s is neither a domain name nor an IP address", clip(host))
	}
	return nil
}

// clip is s quoted, cut to its first 64 bytes: what a request names goes
// into answers, metrics and Events, and the request's head, or a TLS
// server name, may be 16 KiB.
func clip(s string) string {
	const keep = 64
	if len(s) <= keep {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:keep]) + "…"
}

// serverNameFits says whether a ClientHello's server name is the tunnel's
// host: the same name, or none for an address literal (clients send no
// name for an address).
func serverNameFits(name, host string) bool {
	if name == "" {
		_, err := netip.ParseAddr(host)
		return err == nil
	}
	for i := range len(name) {
		// ASCII only: Unicode case folding would take a Kelvin sign for
		// a 'k', and the server would read another name.
		if name[i] >= 0x80 {
			return false
		}
	}
	return asciiLower(strings.TrimSuffix(name, ".")) == host
}

// asciiLower lowers the ASCII letters of s and nothing else.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// forward serves a plain HTTP request in absolute form; br reads what
// follows the request's head.
func (p *Proxy) forward(c net.Conn, br *bufio.Reader, req *http.Request) {
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		p.answer(c, Decision{Reason: "not an absolute http URL"}, refuse(http.StatusBadRequest, "a proxy request names an absolute http:// URL, or is a CONNECT"))
		return
	}
	host, port, err := splitHostPort(req.URL.Host, 80)
	if err == nil {
		err = checkRequestHost(host)
	}
	if err != nil {
		p.answer(c, Decision{Reason: err.Error()}, refuse(http.StatusBadRequest, "%v", err))
		return
	}
	d := Decision{Host: host, Port: port}
	up, err := p.dialFor(c, br, host, port)
	if err != nil {
		p.answer(c, d, err)
		return
	}
	defer up.Close()
	d.Allowed = true
	p.decide(d)
	// A new policy closes a request under way to a host it refuses, as it
	// closes a tunnel: a request's body may stream for as long as a byte
	// moves every IdleTimeout.
	ctx, t := p.opened(host, port, c, up)
	defer t.end()
	defer p.track(t)()
	if t.refusedBy(p.policy()) {
		return
	}
	req.Header.Del("Proxy-Authorization")
	req.Header.Del("Proxy-Connection")
	req.Close = true
	req.RequestURI = ""
	idle := &idleClock{timeout: p.IdleTimeout, conns: []net.Conn{c, up}}
	idle.touch()
	if err := req.Write(limited(ctx, p.up, idle.writer(up))); err != nil {
		return
	}
	_, _ = io.Copy(limited(ctx, p.down, idle.writer(c)), up)
}

// answer refuses a request, telling the client why in a short body and
// reporting the decision.
func (p *Proxy) answer(c net.Conn, d Decision, err error) {
	code, msg := http.StatusBadGateway, err.Error()
	var r *refusal
	if errors.As(err, &r) {
		code = r.code
	}
	d.Reason = msg
	p.decide(d)
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\n",
		code, http.StatusText(code), len(msg)+1, msg)
}

// splice copies both ways until either side ends or the connection is
// idle for IdleTimeout.
func (p *Proxy) splice(ctx context.Context, c net.Conn, fromClient io.Reader, up net.Conn) {
	idle := &idleClock{timeout: p.IdleTimeout, conns: []net.Conn{c, up}}
	idle.touch()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(limited(ctx, p.up, idle.writer(up)), fromClient)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(limited(ctx, p.down, idle.writer(c)), up)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// idleClock pushes both connections' deadlines on with every byte moved.
type idleClock struct {
	timeout time.Duration
	conns   []net.Conn
}

func (i *idleClock) touch() {
	t := time.Now().Add(i.timeout)
	for _, c := range i.conns {
		_ = c.SetDeadline(t)
	}
}

func (i *idleClock) writer(w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		i.touch()
		return w.Write(b)
	})
}

// maxBurst bounds a limiter's burst, and so each write it lets through.
const maxBurst = 64 << 10

// limited is w written no faster than l allows, until ctx ends; w itself
// without l.
func limited(ctx context.Context, l *rate.Limiter, w io.Writer) io.Writer {
	if l == nil {
		return w
	}
	return writerFunc(func(b []byte) (int, error) {
		n := 0
		for len(b) > 0 {
			chunk := b[:min(len(b), l.Burst())]
			// A chunk is at most a second's worth (the burst), but
			// the connections sharing l queue for it: a wait may be
			// long, and ends with ctx.
			if err := l.WaitN(ctx, len(chunk)); err != nil {
				return n, err
			}
			m, err := w.Write(chunk)
			n += m
			if err != nil {
				return n, err
			}
			b = b[len(chunk):]
		}
		return n, nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// clientHello is what the proxy reads of a TLS ClientHello.
type clientHello struct {
	// read says the ClientHello was read whole; nothing else is known
	// when it was not.
	read bool
	// name is its server name ("" when it names none).
	name string
	// encryptedName says it carries an encrypted inner ClientHello (ECH,
	// or its draft ESNI), whose server name the proxy cannot read.
	encryptedName bool
}

// TLS extensions that hide the server name the client asks for.
const (
	extensionECH  = 0xfe0d
	extensionESNI = 0xffce
)

// peekHello reads what the client sends first, and reads it as a TLS
// ClientHello when it is one. first is every byte read, to be sent on as
// it came.
func peekHello(br *bufio.Reader) (first []byte, hello clientHello, isTLS bool, err error) {
	head, err := br.Peek(1)
	if err != nil {
		return nil, hello, false, err
	}
	if head[0] != 0x16 { // not a TLS handshake record
		n := br.Buffered()
		first, _ = br.Peek(n)
		first = bytes.Clone(first)
		_, _ = br.Discard(n)
		return first, hello, false, nil
	}
	rec := &recordingConn{r: br}
	// The standard library parses the ClientHello; the handshake is
	// abandoned once it has, and nothing is ever written to the client.
	errSeen := errors.New("seen")
	_ = tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hello.read = true
		hello.name = h.ServerName
		for _, ext := range h.Extensions {
			if ext == extensionECH || ext == extensionESNI {
				hello.encryptedName = true
			}
		}
		return nil, errSeen
	}}).Handshake()
	return rec.read.Bytes(), hello, true, nil
}

// capReader reads r until left bytes are read (never, when left < 0).
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(b []byte) (int, error) {
	if c.left == 0 {
		return 0, errors.New("the request's head is too long")
	}
	if c.left > 0 && int64(len(b)) > c.left {
		b = b[:c.left]
	}
	n, err := c.r.Read(b)
	if c.left > 0 {
		c.left -= int64(n)
	}
	return n, err
}

// recordingConn is a net.Conn that reads from r, keeping what it read,
// and writes nowhere.
type recordingConn struct {
	net.Conn
	r    io.Reader
	read bytes.Buffer
}

func (c *recordingConn) Read(b []byte) (int, error) {
	if c.read.Len() >= maxHello {
		return 0, io.EOF
	}
	n, err := c.r.Read(b)
	c.read.Write(b[:n])
	return n, err
}

func (c *recordingConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *recordingConn) Close() error                     { return nil }
func (c *recordingConn) SetDeadline(time.Time) error      { return nil }
func (c *recordingConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordingConn) SetWriteDeadline(time.Time) error { return nil }
func (c *recordingConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *recordingConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
