package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// blackhole is a port on 127.0.0.1 that drops every SYN: a listener whose
// accept queue (backlog 0) is full and never accepted from, as a host
// that drops SYNs looks to a dialler.
func blackhole(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*unix.SockaddrInet4).Port
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// Fill the queue until a dial times out.
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return port
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	t.Fatalf("%s still takes connections: its SYNs are not dropped", addr)
	return 0
}

// connectTo sends a CONNECT for target on a new connection to the proxy
// at addr.
func connectTo(t *testing.T, addr, target string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	return c
}

// held is how many of s's slots are taken.
func (s *Slots) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken
}

// tellingNames is names that tells of every lookup on looked.
type tellingNames struct {
	names
	looked chan string
}

func (n tellingNames) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	n.looked <- host
	return n.names.LookupNetIP(ctx, network, host)
}

// slowProxy serves a policy that allows slow.example on a port where
// each of its 1000 addresses drops SYNs; it returns the proxy, its
// address and the CONNECT target. Each lookup, made once the policy
// allowed a request and before its dial, is told on looked.
func slowProxy(t *testing.T, shared *Slots, opts ...func(*Proxy)) (p *Proxy, addr, target string, looked chan string) {
	t.Helper()
	port := blackhole(t)
	addrs := slices.Repeat([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, 1000)
	looked = make(chan string, 100)
	p = &Proxy{
		Policy:   Policy{Rules: []Rule{{Host: "slow.example", Ports: []int{port}}}, AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		Resolver: tellingNames{names{"slow.example": addrs}, looked},
		Shared:   shared,
	}
	for _, o := range opts {
		o(p)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() { _ = p.Serve(l) }()
	return p, l.Addr().String(), fmt.Sprintf("slow.example:%d", port), looked
}

// dialing waits until n dials have looked their name up.
func dialing(t *testing.T, looked chan string, n int) {
	t.Helper()
	for range n {
		select {
		case <-looked:
		case <-time.After(5 * time.Second):
			t.Fatal("the proxy did not begin to dial")
		}
	}
}

// A dial under way holds the connection's slots, this proxy's and the
// node's: a client that leaves, and a new policy that refuses the host,
// end it at once (found by review: clients that sent CONNECT to a name of
// 1000 addresses dropping SYNs and closed held the node's slots for hours).
func TestDialsEndWithTheirClientOrPolicy(t *testing.T) {
	// The node's bound is 16: the 8 clients, of one namespace, stay
	// within its share of three quarters.
	t.Run("the client leaves", func(t *testing.T) {
		shared := NewSlots(16)
		_, proxy, target, looked := slowProxy(t, shared)
		for range 8 {
			connectTo(t, proxy, target).Close()
		}
		dialing(t, looked, 8)
		testenv.Eventually(t, 5*time.Second, "the slots of clients that left are still held by their dials", func() bool {
			return shared.held() == 0
		})
	})
	t.Run("the client leaves after more than its request's head", func(t *testing.T) {
		// What a client sent past the head waits unread for the tunnel,
		// so it cannot be read to see the client go.
		shared := NewSlots(16)
		_, proxy, target, looked := slowProxy(t, shared)
		var clients []net.Conn
		for range 8 {
			c := connectTo(t, proxy, target)
			// The start of a TLS hello, sent without waiting for the answer.
			if _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 'h', 'e', 'l', 'l', 'o'}); err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
		}
		dialing(t, looked, 8)
		for _, c := range clients {
			_ = c.Close()
		}
		testenv.Eventually(t, 5*time.Second, "the slots of clients that sent bytes and left are still held by their dials", func() bool {
			return shared.held() == 0
		})
	})
	t.Run("a new policy refuses the host", func(t *testing.T) {
		shared := NewSlots(8)
		p, proxy, target, looked := slowProxy(t, shared)
		c := connectTo(t, proxy, target)
		dialing(t, looked, 1)
		p.SetPolicy(Policy{AllowedNets: p.Policy.AllowedNets})
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatalf("no answer once the policy refused the host: %v", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("answered %d once the policy refused the host, want 403", resp.StatusCode)
		}
		testenv.Eventually(t, 5*time.Second, "the slot of a refused dial is still held", func() bool { return shared.held() == 0 })
	})
}

// A dial tries at most maxDialAddrs addresses, within DialTimeout all
// together, whatever a name resolves to.
func TestDialIsBounded(t *testing.T) {
	t.Run("within one deadline", func(t *testing.T) {
		_, proxy, target, _ := slowProxy(t, nil, func(p *Proxy) { p.DialTimeout = 500 * time.Millisecond })
		c := connectTo(t, proxy, target)
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatalf("no answer for a name of 1000 addresses that drop SYNs, dial timeout 500ms: %v", err)
		}
		_ = resp.Body.Close()
		if took := time.Since(start); resp.StatusCode != http.StatusBadGateway || took > 3*time.Second {
			t.Fatalf("answered %d after %s, want 502 after about 500ms", resp.StatusCode, took)
		}
	})
	t.Run("at most four addresses", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "reached") }))
		defer srv.Close()
		// Four addresses refuse at once (nothing listens on the server's
		// port there); the fifth is the server.
		addrs := []netip.Addr{
			netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"),
			netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("127.0.0.5"),
			netip.MustParseAddr("127.0.0.1"),
		}
		h := newHarness(t, labPolicy(Rule{Host: "many.example", Ports: []int{port(t, srv)}}), names{"many.example": addrs}, 0)
		body, err := get(h.client(""), fmt.Sprintf("http://many.example:%d/", port(t, srv)))
		if err == nil || strings.Contains(body, "reached") {
			t.Fatalf("a fifth address was tried: %q, %v", body, err)
		}
		h.proxy.Resolver = names{"many.example": addrs[3:]}
		if body, err := get(h.client(""), fmt.Sprintf("http://many.example:%d/", port(t, srv))); err != nil || body != "reached" {
			t.Fatalf("the second of two addresses: %q, %v", body, err)
		}
	})
}

// Stopping a proxy gives its tunnels' slots back at once, whatever they
// wait for: their share of a bandwidth bound, or a destination that stops
// reading what they write.
func TestStopEndsTunnelsThatWait(t *testing.T) {
	for _, tc := range []struct {
		name           string
		bytesPerSecond int64
		read           bool
		write          int
	}{
		{name: "for the bandwidth bound", bytesPerSecond: 1 << 10, read: true, write: 32 << 10},
		{name: "for a destination that does not read", write: 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := destination(t, tc.read)
			shared := NewSlots(16)
			p := &Proxy{
				Policy:         Policy{Rules: []Rule{{Host: "example.com", Ports: []int{dest}}}, AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
				Resolver:       names{"example.com": loopback},
				BytesPerSecond: tc.bytesPerSecond,
				Shared:         shared,
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() { _ = p.Serve(l) }()
			const conns = 8
			for range conns {
				c := connectTo(t, l.Addr().String(), fmt.Sprintf("example.com:%d", dest))
				resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("CONNECT to an allowed host: %v %v", resp, err)
				}
				_ = resp.Body.Close()
				go func() { _, _ = c.Write(make([]byte, tc.write)) }()
			}
			// Every tunnel waits by now.
			time.Sleep(time.Second)
			p.Stop()
			deadline := time.Now().Add(5 * time.Second)
			for shared.held() > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d slots still held 5s after the proxy stopped", shared.held(), conns)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// destination is a port on 127.0.0.1 whose connections are read to
// their end, or never read when read is false.
func destination(t *testing.T, read bool) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if read {
				go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
			} else {
				// Held open, unread, until the test ends.
				go func() { <-done; _ = c.Close() }()
			}
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}
