package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func TestCheckRule(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		bad  string
	}{
		{Rule{Host: "github.com"}, ""},
		{Rule{Host: "*.pythonhosted.org", Ports: []int{443}}, ""},
		{Rule{Host: "192.0.2.7"}, ""},
		{Rule{Host: ""}, "empty"},
		{Rule{Host: "localhost"}, "at least two labels"},
		{Rule{Host: "a.*.example.com"}, "first label"},
		{Rule{Host: "Git_Hub.com"}, "lowercase letters"},
		{Rule{Host: "github.com", Ports: []int{0}}, "between 1 and 65535"},
	} {
		err := CheckRule(tc.rule)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%+v: %v", tc.rule, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%+v: %v, want an error saying %q", tc.rule, err, tc.bad)
		}
	}
}

func TestPolicyAllows(t *testing.T) {
	p := Policy{Rules: []Rule{{Host: "github.com"}, {Host: "*.pythonhosted.org", Ports: []int{443}}, {Host: "192.0.2.7", Ports: []int{8443}}}}
	for _, tc := range []struct {
		host string
		port int
		want bool
	}{
		{"github.com", 443, true},
		{"GitHub.com.", 80, true},
		{"github.com", 22, false},
		{"api.github.com", 443, false},
		{"files.pythonhosted.org", 443, true},
		{"pythonhosted.org", 443, false},
		{"evilpythonhosted.org", 443, false},
		{"files.pythonhosted.org", 80, false},
		{"192.0.2.7", 8443, true},
		{"192.0.2.7", 443, false},
		{"192.0.2.8", 8443, false},
		{"[::1]", 443, false},
	} {
		if got := p.Allows(tc.host, tc.port); got != tc.want {
			t.Errorf("Allows(%s, %d) = %v, want %v", tc.host, tc.port, got, tc.want)
		}
	}
}

func TestReachable(t *testing.T) {
	def := Policy{}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"8.8.8.8", true},
		{"2001:4860:4860::8888", true},
		{"127.0.0.1", false},
		{"169.254.169.254", false},
		{"10.96.0.1", false},
		{"172.20.0.5", false},
		{"192.168.1.1", false},
		{"100.64.0.1", false},
		{"0.0.0.0", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
		{"::ffff:169.254.169.254", false},
		{"fd00::1", false},
		{"fe80::1", false},
		{"224.0.0.1", false},
		// Azure's WireServer: public, and it hands a node its secrets.
		{"168.63.129.16", false},
		{"168.63.129.17", true},
	} {
		if got := def.Reachable(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Reachable(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	lab := Policy{AllowedNets: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}}
	if !lab.Reachable(netip.MustParseAddr("10.200.3.4")) || lab.Reachable(netip.MustParseAddr("10.201.0.1")) {
		t.Error("AllowedNets opens its range and nothing else")
	}
	cluster := Policy{InternalNets: []netip.Prefix{netip.MustParsePrefix("11.96.0.0/12")}}
	if cluster.Reachable(netip.MustParseAddr("11.96.0.10")) || !cluster.Reachable(netip.MustParseAddr("11.128.0.1")) {
		t.Error("InternalNets closes its range and nothing else")
	}
	cluster.AllowedNets = []netip.Prefix{netip.MustParsePrefix("11.96.0.10/32")}
	if !cluster.Reachable(netip.MustParseAddr("11.96.0.10")) {
		t.Error("a class's AllowedNets opens an operator's internal range")
	}
	node := Policy{AllowedNets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, NodeNets: []netip.Prefix{netip.MustParsePrefix("10.0.1.5/32")}}
	if node.Reachable(netip.MustParseAddr("10.0.1.5")) || node.Reachable(netip.MustParseAddr("::ffff:10.0.1.5")) || !node.Reachable(netip.MustParseAddr("10.0.1.6")) {
		t.Error("a class's AllowedNets opens the node's own address inside it, or NodeNets closes more than the node")
	}
}

// names resolves the test's names; anything else does not resolve.
type names map[string][]netip.Addr

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	host = strings.TrimSuffix(host, ".") // the proxy asks for absolute names
	if a, ok := n[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// harness is a proxy on a real socket and the servers it may reach,
// listening on loopback: "example.com" (the name httptest's certificate
// holds) resolves to them.
type harness struct {
	proxy     *Proxy
	proxyURL  *url.URL
	tlsSrv    *httptest.Server
	plainSrv  *httptest.Server
	pool      *x509.CertPool
	mu        sync.Mutex
	decisions []Decision
}

func (h *harness) record(d Decision) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.decisions = append(h.decisions, d)
}

func (h *harness) denied() []Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Decision
	for _, d := range h.decisions {
		if !d.Allowed {
			out = append(out, d)
		}
	}
	return out
}

func newHarness(t *testing.T, policy func(tlsPort, plainPort int) Policy, resolve names, maxConns int, opts ...func(*Proxy)) *harness {
	t.Helper()
	h := &harness{}
	h.tlsSrv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "tls ok") }))
	t.Cleanup(h.tlsSrv.Close)
	h.plainSrv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "plain ok %s %s", r.Host, r.Header.Get("Proxy-Authorization"))
	}))
	t.Cleanup(h.plainSrv.Close)
	h.pool = x509.NewCertPool()
	h.pool.AddCert(h.tlsSrv.Certificate())

	p := &Proxy{Policy: policy(port(t, h.tlsSrv), port(t, h.plainSrv)), Resolver: resolve, MaxConns: maxConns, IdleTimeout: 10 * time.Second, OnDecision: h.record}
	for _, o := range opts {
		o(p)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() { _ = p.Serve(l) }()
	h.proxy = p
	h.proxyURL = &url.URL{Scheme: "http", Host: l.Addr().String()}
	return h
}

func port(t *testing.T, s *httptest.Server) int {
	t.Helper()
	return s.Listener.Addr().(*net.TCPAddr).Port
}

func (h *harness) client(serverName string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(h.proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: h.pool, ServerName: serverName},
	}}
}

func get(c *http.Client, u string) (string, error) {
	resp, err := c.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return string(b), nil
}

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// The servers listen on loopback, so the policies here allow 127.0.0.0/8
// as a class may allow a lab network; TestInternalAddressesAreRefused
// shows what happens without.
func labPolicy(rules ...Rule) func(int, int) Policy {
	return func(tlsPort, plainPort int) Policy {
		p := Policy{AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
		for _, r := range rules {
			if len(r.Ports) == 0 {
				r.Ports = []int{tlsPort, plainPort}
			}
			p.Rules = append(p.Rules, r)
		}
		return p
	}
}

func TestProxyLetsTheListThroughAndNothingElse(t *testing.T) {
	h := newHarness(t, labPolicy(Rule{Host: "example.com"}, Rule{Host: "127.0.0.1"}), names{
		"example.com": loopback, "other.example": loopback,
	}, 0)
	tlsURL := fmt.Sprintf("https://example.com:%d/", port(t, h.tlsSrv))
	plainURL := fmt.Sprintf("http://example.com:%d/", port(t, h.plainSrv))

	t.Run("an allowed name over HTTPS", func(t *testing.T) {
		body, err := get(h.client(""), tlsURL)
		if err != nil || body != "tls ok" {
			t.Fatalf("%q, %v", body, err)
		}
	})
	t.Run("an allowed name over HTTP, without the proxy's own headers", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, plainURL, nil)
		req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
		resp, err := h.client("").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := fmt.Sprintf("plain ok example.com:%d ", port(t, h.plainSrv)); string(b) != want {
			t.Fatalf("%q, want %q", b, want)
		}
	})
	t.Run("a Host header never fronts for another host", func(t *testing.T) {
		c, err := net.Dial("tcp", h.proxyURL.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: evil.example\r\n\r\n", plainURL)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := fmt.Sprintf("plain ok example.com:%d ", port(t, h.plainSrv)); string(b) != want {
			t.Fatalf("the server saw %q, want %q", b, want)
		}
	})
	t.Run("a name not on the list", func(t *testing.T) {
		_, err := get(h.client(""), fmt.Sprintf("https://other.example:%d/", port(t, h.tlsSrv)))
		if err == nil || !strings.Contains(err.Error(), "Forbidden") {
			t.Fatalf("%v, want Forbidden", err)
		}
		_, err = get(h.client(""), fmt.Sprintf("http://other.example:%d/", port(t, h.plainSrv)))
		if err == nil || !strings.Contains(err.Error(), "not in the Sandbox's egress allowlist") {
			t.Fatalf("%v, want the allowlist named", err)
		}
	})
	t.Run("an allowed name with another TLS server name", func(t *testing.T) {
		// The client would accept any certificate: only the proxy stops it.
		c := h.client("other.example")
		c.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
		if _, err := get(c, tlsURL); err == nil {
			t.Fatal("a tunnel opened for example.com carried a TLS connection for other.example")
		}
	})
	t.Run("a listed address literal, whose TLS names no server", func(t *testing.T) {
		c := h.client("")
		c.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
		body, err := get(c, fmt.Sprintf("https://127.0.0.1:%d/", port(t, h.tlsSrv)))
		if err != nil || body != "tls ok" {
			t.Fatalf("%q, %v", body, err)
		}
	})
	t.Run("an address literal the list does not name", func(t *testing.T) {
		if _, err := get(h.client("example.com"), fmt.Sprintf("https://127.0.0.2:%d/", port(t, h.tlsSrv))); err == nil || !strings.Contains(err.Error(), "Forbidden") {
			t.Fatalf("%v, want Forbidden", err)
		}
	})
	if len(h.denied()) < 4 {
		t.Errorf("denials reported: %+v", h.denied())
	}
	for _, d := range h.denied() {
		if d.Reason == "" {
			t.Errorf("a denial without a reason: %+v", d)
		}
	}
}

func TestInternalAddressesAreRefused(t *testing.T) {
	// The same list, without the lab range: example.com resolves to
	// loopback, which a Sandbox never reaches.
	h := newHarness(t, func(tlsPort, plainPort int) Policy {
		return Policy{Rules: []Rule{{Host: "example.com", Ports: []int{tlsPort, plainPort}}, {Host: "meta.example", Ports: []int{80}}}}
	}, names{"example.com": loopback, "meta.example": {netip.MustParseAddr("169.254.169.254")}}, 0)
	_, err := get(h.client(""), fmt.Sprintf("https://example.com:%d/", port(t, h.tlsSrv)))
	if err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("%v, want Forbidden", err)
	}
	body, err := get(h.client(""), "http://meta.example/latest/meta-data/")
	if err == nil || !strings.Contains(body, "internal addresses") {
		t.Fatalf("%q, %v: want a refusal naming internal addresses", body, err)
	}
}

func TestConnectionsAreBounded(t *testing.T) {
	h := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 1)
	// One tunnel held open.
	c, err := net.Dial("tcp", h.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT example.com:%d HTTP/1.1\r\nHost: example.com\r\n\r\n", port(t, h.tlsSrv))
	buf := make([]byte, 64)
	if n, err := c.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "200") {
		t.Fatalf("%q, %v", buf[:n], err)
	}
	if _, err := get(h.client(""), fmt.Sprintf("https://example.com:%d/", port(t, h.tlsSrv))); err == nil {
		t.Fatal("a second connection was served past MaxConns 1")
	}
}

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		pattern, host string
		want          bool
	}{
		{"*", "anything.example", true},
		{"github.com", "github.com", true},
		{"github.com", "GitHub.com.", true},
		{"github.com", "api.github.com", false},
		{"*.pythonhosted.org", "files.pythonhosted.org", true},
		{"*.pythonhosted.org", "*.cdn.pythonhosted.org", true},
		{"*.pythonhosted.org", "pythonhosted.org", false},
		{"*.pythonhosted.org", "evilpythonhosted.org", false},
		{"*.pythonhosted.org", "*.org", false},
		{"192.0.2.1", "192.0.2.1", true},
		{"*.2.1", "192.0.2.1", false},
	} {
		if got := Covers(tc.pattern, tc.host); got != tc.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tc.pattern, tc.host, got, tc.want)
		}
	}
	if err := CheckRule(Rule{Host: "fe80::1%eth0"}); err == nil {
		t.Error("an address with a zone must be refused")
	}
}

// A proxy with BytesPerSecond moves no more than that: 96 KiB at 32 KiB/s
// (a burst of 32 KiB) takes at least two seconds. Only a lower bound is
// held, which a loaded machine cannot break.
func TestBandwidthIsBounded(t *testing.T) {
	body := strings.Repeat("x", 96<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
	defer srv.Close()
	p := &Proxy{Policy: labPolicy(Rule{Host: "example.com"})(0, port(t, srv)), Resolver: names{"example.com": loopback}, BytesPerSecond: 32 << 10}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { _ = p.Serve(l) }()
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: l.Addr().String()})}}
	start := time.Now()
	got, err := get(c, fmt.Sprintf("http://example.com:%d/", port(t, srv)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(body) {
		t.Fatalf("got %d bytes, want %d", len(got), len(body))
	}
	if took := time.Since(start); took < 1900*time.Millisecond {
		t.Fatalf("96 KiB at 32 KiB/s took %s: the bound did not hold", took)
	}
}

// recordingNames is names that remembers what it was asked.
type recordingNames struct {
	names
	asked []string
}

func (r *recordingNames) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.asked = append(r.asked, host)
	return r.names.LookupNetIP(ctx, network, host)
}

// The ways around the tunnel's checks the review found, each refused: a
// client that waits out the ClientHello's deadline before naming another
// host, plain HTTP inside a tunnel to the web's ports (its Host header
// would go unread), a server name that only Unicode case folding makes
// the host's, a request host that is no name; and names are resolved as
// absolute names, never below the resolver's search domains.
func TestTunnelChecksCannotBeSkipped(t *testing.T) {
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "tls ok") }))
	defer tlsSrv.Close()
	res := &recordingNames{names: names{"example.com": loopback, "k.example.com": loopback}}
	var mu sync.Mutex
	var reasons []string
	p := &Proxy{
		Policy:       Policy{Rules: []Rule{{Host: "example.com", Ports: []int{443, port(t, tlsSrv)}}, {Host: "*.example.com", Ports: []int{port(t, tlsSrv)}}}, AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		Resolver:     res,
		HelloTimeout: 300 * time.Millisecond,
		OnDecision: func(d Decision) {
			mu.Lock()
			reasons = append(reasons, d.Reason)
			mu.Unlock()
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { _ = p.Serve(l) }()

	// tunnel opens a CONNECT to target and returns the connection after
	// the proxy's answer, or the answer's status line when it refused.
	tunnel := func(target string) (net.Conn, string) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			c.Close()
			return nil, resp.Status
		}
		return c, ""
	}
	tlsTarget := fmt.Sprintf("example.com:%d", port(t, tlsSrv))
	pool := x509.NewCertPool()
	pool.AddCert(tlsSrv.Certificate())

	t.Run("silence past the deadline, then another name", func(t *testing.T) {
		c, _ := tunnel(tlsTarget)
		defer c.Close()
		time.Sleep(600 * time.Millisecond)
		tc := tls.Client(c, &tls.Config{ServerName: "other.example", RootCAs: pool, InsecureSkipVerify: true})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err == nil {
			t.Fatal("a handshake for another name went through after the deadline")
		}
	})
	t.Run("plain HTTP in a tunnel to port 443", func(t *testing.T) {
		// A plain server on port 443 of its own address, which the
		// tunnel reaches: the proxy must not forward plain bytes to it.
		pl, err := net.Listen("tcp", "127.0.0.3:443")
		if err != nil {
			testenv.Missing(t, "binding port 443", "run the tests as root (CI does): "+err.Error())
		}
		defer pl.Close()
		got := make(chan string, 1)
		go func() {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 256)
			n, _ := c.Read(b)
			got <- string(b[:n])
		}()
		res.names["plain.example.com"] = []netip.Addr{netip.MustParseAddr("127.0.0.3")}
		p.SetPolicy(Policy{Rules: append(p.Policy.Rules, Rule{Host: "plain.example.com", Ports: []int{443}}), AllowedNets: p.Policy.AllowedNets})
		defer p.SetPolicy(p.Policy)
		c, status := tunnel("plain.example.com:443")
		if c == nil {
			t.Fatalf("the tunnel itself was refused: %s", status)
		}
		defer c.Close()
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: evil.example.net\r\n\r\n")
		select {
		case b := <-got:
			if b != "" {
				t.Fatalf("plain HTTP flowed through a tunnel to port 443: the server read %q", b)
			}
		case <-time.After(3 * time.Second):
		}
	})
	t.Run("a server name equal only under Unicode folding", func(t *testing.T) {
		c, _ := tunnel(fmt.Sprintf("k.example.com:%d", port(t, tlsSrv)))
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: "\u212a.example.com", InsecureSkipVerify: true})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err == nil {
			t.Fatal("a Kelvin sign passed for a k")
		}
	})
	t.Run("a request host that is no name", func(t *testing.T) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, "CONNECT /p HTTP/1.1\r\nHost: 1.2.3.4 x.example.com:443\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err == nil {
			_ = resp.Body.Close()
		}
		if err == nil && resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %s, want 400 Bad Request", resp.Status)
		}
	})
	t.Run("names are asked for as absolute names", func(t *testing.T) {
		c, _ := tunnel(tlsTarget)
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: pool})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			t.Fatalf("the allowed tunnel: %v", err)
		}
		for _, a := range res.asked {
			if !strings.HasSuffix(a, ".") {
				t.Fatalf("the resolver was asked for %q, a name its search domains would extend", a)
			}
		}
	})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("refusals: %q", reasons)
}

func TestHostAddressesAreOfThisHost(t *testing.T) {
	own, err := HostAddresses()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(own, func(p netip.Prefix) bool { return p.Addr() == netip.MustParseAddr("127.0.0.1") && p.Bits() == 32 }) {
		t.Fatalf("127.0.0.1/32 is not among this host's addresses %v", own)
	}
	pol := Policy{InternalNets: own}
	for _, p := range own {
		if pol.Reachable(p.Addr()) {
			t.Errorf("the host's own %s is reachable", p.Addr())
		}
	}
}

// A new policy closes the open tunnels it no longer allows, and leaves
// the others.
func TestNewPolicyClosesRefusedTunnels(t *testing.T) {
	h := newHarness(t, labPolicy(Rule{Host: "example.com"}, Rule{Host: "other.example"}), names{"example.com": loopback, "other.example": loopback}, 0)
	open := func(host string) *tls.Conn {
		c, err := net.Dial("tcp", h.proxyURL.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		target := fmt.Sprintf("%s:%d", host, port(t, h.tlsSrv))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT %s: %v %v", host, resp, err)
		}
		_ = resp.Body.Close()
		tc := tls.Client(c, &tls.Config{ServerName: host, InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("TLS to %s: %v", host, err)
		}
		return tc
	}
	kept, cut := open("example.com"), open("other.example")
	h.proxy.SetPolicy(labPolicy(Rule{Host: "example.com"})(port(t, h.tlsSrv), port(t, h.plainSrv)))
	_ = cut.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := cut.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the tunnel to a host the new policy refuses is still open: %v", err)
	}
	fmt.Fprint(kept, "GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
	_ = kept.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(kept), nil)
	if err != nil {
		t.Fatalf("the allowed tunnel after the new policy: %v", err)
	}
	_ = resp.Body.Close()
}

// withECH is a ClientHello for serverName with an outer Encrypted Client
// Hello extension appended: the name it shows is serverName, the one an
// ECH-aware server would serve is sealed inside.
func withECH(t *testing.T, serverName string) []byte {
	t.Helper()
	// An outer ECH extension: type 0 (outer), HKDF-SHA256, AES-128-GCM,
	// config 7, an encapsulated key and a sealed inner hello.
	payload := append([]byte{0, 0, 1, 0, 1, 7, 0, 32}, make([]byte, 32)...)
	payload = append(payload, 0, 64)
	payload = append(payload, bytes.Repeat([]byte{0xa5}, 64)...)
	return withExtension(t, serverName, 0xfe0d, payload)
}

// withExtension is the records of a ClientHello for serverName with an
// extension of type typ appended, split as TLS splits a hello longer
// than a record.
func withExtension(t *testing.T, serverName string, typ uint16, payload []byte) []byte {
	t.Helper()
	cli, srv := net.Pipe()
	go func() {
		_ = tls.Client(cli, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	}()
	defer cli.Close()
	defer srv.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(srv, head); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(head[3])<<8|int(head[4]))
	if _, err := io.ReadFull(srv, body); err != nil {
		t.Fatal(err)
	}
	ext := append([]byte{byte(typ >> 8), byte(typ), byte(len(payload) >> 8), byte(len(payload))}, payload...)
	// The extensions end the ClientHello: their length is the last
	// length field before them.
	off := 4 + 2 + 32
	off += 1 + int(body[off])
	off += 2 + (int(body[off])<<8 | int(body[off+1]))
	off += 1 + int(body[off])
	extLen := int(body[off])<<8 | int(body[off+1]) + len(ext)
	body[off], body[off+1] = byte(extLen>>8), byte(extLen)
	body = append(body, ext...)
	hsLen := len(body) - 4
	body[1], body[2], body[3] = byte(hsLen>>16), byte(hsLen>>8), byte(hsLen)
	var out []byte
	for len(body) > 0 {
		n := min(len(body), 16<<10)
		out = append(out, head[0], head[1], head[2], byte(n>>8), byte(n))
		out = append(out, body[:n]...)
		body = body[n:]
	}
	return out
}

// What a hostile client sends a tunnel: a ClientHello that hides the name
// it asks for, one too long for the proxy to read, and a host name sized
// to fill the controller's metrics.
func TestTunnelRefusesWhatItCannotCheck(t *testing.T) {
	h := newHarness(t, labPolicy(Rule{Host: "example.com"}, Rule{Host: "127.0.0.1"}), names{"example.com": loopback}, 0)
	connect := func(target string) (net.Conn, int) {
		t.Helper()
		c, err := net.Dial("tcp", h.proxyURL.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return c, resp.StatusCode
	}

	t.Run("an Encrypted Client Hello", func(t *testing.T) {
		c, code := connect(fmt.Sprintf("example.com:%d", port(t, h.tlsSrv)))
		if code != http.StatusOK {
			t.Fatalf("CONNECT to an allowed host: %d", code)
		}
		if _, err := c.Write(withECH(t, "example.com")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("the server answered an Encrypted Client Hello through the tunnel (%d bytes)", n)
		}
		var seen bool
		for _, d := range h.denied() {
			seen = seen || strings.Contains(d.Reason, "Encrypted Client Hello")
		}
		if !seen {
			t.Fatalf("no refusal names the Encrypted Client Hello: %+v", h.denied())
		}
	})

	t.Run("a ClientHello too long to read, to an address literal", func(t *testing.T) {
		// An address literal's tunnel takes a hello that names no server;
		// one the proxy could not read names one all the same.
		c, code := connect(fmt.Sprintf("127.0.0.1:%d", port(t, h.tlsSrv)))
		if code != http.StatusOK {
			t.Fatalf("CONNECT to an allowed address: %d", code)
		}
		hello := withExtension(t, "other.example", 0x0015, make([]byte, 20<<10)) // padding
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("the server answered a %d-byte ClientHello for other.example through a tunnel to 127.0.0.1 (%d bytes)", len(hello), n)
		}
	})

	t.Run("a server name of 12 KB", func(t *testing.T) {
		c, code := connect(fmt.Sprintf("example.com:%d", port(t, h.tlsSrv)))
		if code != http.StatusOK {
			t.Fatalf("CONNECT to an allowed host: %d", code)
		}
		tc := tls.Client(c, &tls.Config{ServerName: strings.Repeat("\xff", 12<<10), InsecureSkipVerify: true})
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err == nil {
			t.Fatal("a handshake for another name went through")
		}
		for _, d := range h.denied() {
			if len(d.Reason) > 512 {
				t.Fatalf("a refusal reports %d bytes of reason to the metrics and Events", len(d.Reason))
			}
		}
	})

	t.Run("a host name of 16 KB", func(t *testing.T) {
		_, code := connect(strings.Repeat("\xff", 12<<10) + ":443")
		if code != http.StatusBadRequest {
			t.Fatalf("CONNECT to 12 KiB of 0xff: %d, want 400", code)
		}
		for _, d := range h.denied() {
			if len(d.Host) > 253 || len(d.Reason) > 512 {
				t.Fatalf("a refusal reports %d bytes of host and %d of reason to the metrics and Events", len(d.Host), len(d.Reason))
			}
		}
	})
}

// A plain request's body streams for as long as bytes move; a new policy
// that refuses its host ends it, as it ends a tunnel.
func TestNewPolicyEndsAPlainRequestUnderWay(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	var mu sync.Mutex
	var got []byte
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		c, err := up.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			mu.Lock()
			got = append(got, buf[:n]...)
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	received := func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Clone(got)
	}
	upPort := up.Addr().(*net.TCPAddr).Port
	pol := Policy{Rules: []Rule{{Host: "example.com", Ports: []int{upPort}}}, AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	p := &Proxy{Policy: pol, Resolver: names{"example.com": loopback}, IdleTimeout: 10 * time.Second}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { _ = p.Serve(l) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST http://example.com:%d/ HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n", upPort)
	for deadline := time.Now().Add(20 * time.Second); !bytes.Contains(received(), []byte("first")); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the request's first chunk never reached the allowed host: %q", received())
		}
	}
	p.SetPolicy(Policy{AllowedNets: pol.AllowedNets})
	fmt.Fprint(c, "6\r\nSECRET\r\n0\r\n\r\n")
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
	}
	if b := received(); bytes.Contains(b, []byte("SECRET")) {
		t.Fatalf("a chunk sent after the new policy refused the host reached it:\n%s", b)
	}
	select {
	case <-ended:
	default:
		t.Fatal("the request to a host the new policy refuses was not ended")
	}
}

// connectThrough opens a tunnel to example.com, h's TLS server, through
// h's proxy, and returns the connection, open until the test ends, and
// the start of the proxy's answer.
func connectThrough(t *testing.T, h *harness) (net.Conn, string) {
	t.Helper()
	c, err := net.Dial("tcp", h.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT example.com:%d HTTP/1.1\r\nHost: example.com\r\n\r\n", port(t, h.tlsSrv))
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, _ := c.Read(buf)
	return c, string(buf[:n])
}

// Each connection holds the controller's descriptors, not the Sandbox's:
// the proxies of all the Sandboxes share a bound, and a Sandbox at its own
// bound cannot take the others' way out with it past that.
func TestConnectionsAreBoundedAcrossProxies(t *testing.T) {
	shared := NewSlots(2)
	share := func(p *Proxy) { p.Shared = shared }
	a := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 0, share)
	b := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 0, share)
	hold := func(h *harness) net.Conn {
		t.Helper()
		c, answer := connectThrough(t, h)
		if !strings.Contains(answer, " 200 ") {
			t.Fatalf("a tunnel within the shared bound: %q", answer)
		}
		return c
	}
	first := hold(a)
	hold(a)
	url := fmt.Sprintf("https://example.com:%d/", port(t, b.tlsSrv))
	if _, err := get(b.client(""), url); err == nil {
		t.Fatal("another proxy served a connection past the bound they share")
	}
	var refused bool
	for _, d := range b.denied() {
		refused = refused || strings.HasPrefix(d.Reason, "too many connections on this node")
	}
	if !refused {
		t.Fatalf("no refusal says the node's bound was reached: %+v", b.denied())
	}
	first.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := get(b.client(""), url); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("a slot given back was not taken again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The node's bound is shared by every tenant: the Sandboxes of one
// namespace together hold at most three quarters of it, so however many
// Sandboxes a tenant runs at their own bound, a Sandbox of another
// namespace still gets a connection.
func TestANamespaceHoldsAtMostItsShareOfTheNode(t *testing.T) {
	shared := NewSlots(8)
	of := func(tenant string) func(*Proxy) {
		return func(p *Proxy) { p.Shared, p.Tenant = shared, tenant }
	}
	a1 := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 0, of("team-a"))
	a2 := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 0, of("team-a"))
	b := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 0, of("team-b"))
	// tunnel opens a tunnel through h and says whether the proxy let it
	// through; an open one stays open until the test ends.
	tunnel := func(h *harness) bool {
		t.Helper()
		_, answer := connectThrough(t, h)
		return strings.Contains(answer, " 200 ")
	}
	held := 0
	for _, h := range []*harness{a1, a2, a1, a2, a1, a2, a1, a2} {
		if tunnel(h) {
			held++
		}
	}
	if held != 6 {
		t.Errorf("the Sandboxes of namespace team-a hold %d of the node's 8 connections, want 6 (three quarters)", held)
	}
	var named bool
	for _, d := range append(a1.denied(), a2.denied()...) {
		named = named || strings.Contains(d.Reason, "team-a") && strings.Contains(d.Reason, "--egress-max-connections-total")
	}
	if !named {
		t.Errorf("no refusal names the namespace and the node's bound: %+v %+v", a1.denied(), a2.denied())
	}
	if !tunnel(b) {
		t.Fatalf("a Sandbox of namespace team-b gets no connection while team-a holds %d: %+v", held, b.denied())
	}
	// Two namespaces together do not take the last one either: team-b,
	// holding one of the two that were free, gets no second, and a third
	// namespace still gets one.
	if tunnel(b) {
		t.Errorf("team-b got the node's last connection while team-a holds %d and team-b one", held)
	}
	c := newHarness(t, labPolicy(Rule{Host: "example.com"}), names{"example.com": loopback}, 0, of("team-c"))
	if !tunnel(c) {
		t.Fatalf("a Sandbox of namespace team-c gets no connection while team-a and team-b hold the others: %+v", c.denied())
	}
	for _, d := range b.denied() {
		if !strings.Contains(d.Reason, "last quarter") || !strings.Contains(d.Reason, "--egress-max-connections-total") {
			t.Errorf("team-b's refusal does not say the last quarter goes to namespaces holding fewer, nor the flag: %q", d.Reason)
		}
	}
}
