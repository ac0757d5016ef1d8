package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// A namespace has no way out but its proxy: inside it, the host's
// loopback and any outside address are unreachable, and the proxy,
// listening inside and served from the host, reaches an allowed server.
func TestNamespaceHasNoRouteButTheProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need CAP_SYS_ADMIN: run the tests as root (make test does in CI)")
	}
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "reached") }))
	defer host.Close()
	hostAddr := host.Listener.Addr().(*net.TCPAddr)

	ns, l, err := NewNamespace(filepath.Join(t.TempDir(), "net"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ns.Remove(); err != nil {
			t.Error(err)
		}
	}()
	p := &Proxy{
		Policy:   Policy{Rules: []Rule{{Host: "example.com", Ports: []int{hostAddr.Port}}}, AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		Resolver: names{"example.com": loopback},
	}
	go func() { _ = p.Serve(l) }()
	defer l.Close()

	err = ns.Run(func() error {
		// Dialled from this thread, so the sockets are the namespace's.
		if c, err := net.DialTimeout("tcp", hostAddr.String(), 2*time.Second); err == nil {
			c.Close()
			return fmt.Errorf("the host's loopback (%s) answered inside the namespace", hostAddr)
		}
		if c, err := net.DialTimeout("tcp", "192.0.2.1:80", 2*time.Second); err == nil {
			c.Close()
			return fmt.Errorf("an outside address answered inside the namespace")
		} else if !strings.Contains(err.Error(), "unreachable") {
			return fmt.Errorf("dialling out: %w, want the network unreachable", err)
		}
		c, err := net.DialTimeout("tcp", l.Addr().String(), 2*time.Second)
		if err != nil {
			return fmt.Errorf("the proxy is not reachable inside the namespace: %w", err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET http://example.com:%d/ HTTP/1.1\r\nHost: example.com:%d\r\n\r\n", hostAddr.Port, hostAddr.Port)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(b) != "reached" {
			return fmt.Errorf("through the proxy: %d %q", resp.StatusCode, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Releasing a proxy ends what it serves, not only its listener: an open
// tunnel would go on with the old policy, and a dial under way would hold
// its slots of the node's bound, with no Sandbox left to free them
// (found by review).
func TestReleaseEndsWhatTheProxyServes(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need CAP_SYS_ADMIN: run the tests as root (make test does in CI)")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "reached") }))
	defer srv.Close()
	srvPort := srv.Listener.Addr().(*net.TCPAddr).Port
	slow := blackhole(t)
	looked := make(chan string, 10)
	n := &Networks{
		Dir: t.TempDir(),
		Resolver: tellingNames{names{
			"example.com":  loopback,
			"slow.example": slices.Repeat(loopback, 1000),
		}, looked},
		Shared: NewSlots(8),
	}
	defer n.Close()
	path, err := n.Serve("sb", "team-a", Policy{
		Rules:       []Rule{{Host: "example.com", Ports: []int{srvPort}}, {Host: "slow.example", Ports: []int{slow}}},
		AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var tunnel, dial net.Conn
	err = (&Namespace{Path: path}).Run(func() error {
		proxy := fmt.Sprintf("127.0.0.1:%d", ProxyPort)
		var err error
		if tunnel, err = net.Dial("tcp", proxy); err != nil {
			return err
		}
		if dial, err = net.Dial("tcp", proxy); err != nil {
			return err
		}
		fmt.Fprintf(dial, "CONNECT slow.example:%d HTTP/1.1\r\nHost: slow.example\r\n\r\n", slow)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tunnel.Close()
	defer dial.Close()
	dialing(t, looked, 1)
	fmt.Fprintf(tunnel, "CONNECT example.com:%d HTTP/1.1\r\nHost: example.com\r\n\r\n", srvPort)
	br := bufio.NewReader(tunnel)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT to an allowed host: %v %v", resp, err)
	}
	_ = resp.Body.Close()
	fmt.Fprint(tunnel, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("through the tunnel: %v %v", resp, err)
	}
	_ = resp.Body.Close()
	if n.Shared.held() != 2 {
		t.Fatalf("%d slots held by a tunnel and a dial, want 2", n.Shared.held())
	}

	if err := n.Release("sb"); err != nil {
		t.Fatal(err)
	}
	_ = tunnel.SetReadDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(tunnel, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("the tunnel of a released proxy still reaches its host: %d", resp.StatusCode)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the tunnel of a released proxy is still open")
	}
	testenv.Eventually(t, 5*time.Second, "a released proxy's dial still holds a slot of the node's bound", func() bool { return n.Shared.held() == 0 })
}

// A proxy's connections count against the share of the tenant it was
// served for; the name served for another tenant gets a proxy of its own,
// or that tenant's connections would count against the first one's share.
func TestServeKeepsTheTenantOfItsSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need CAP_SYS_ADMIN: run the tests as root (make test does in CI)")
	}
	n := &Networks{Dir: t.TempDir(), Shared: NewSlots(8)}
	defer n.Close()
	tenant := func() string {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.served["sb"].proxy.Tenant
	}
	for _, want := range []string{"team-a", "team-a", "team-b"} {
		if _, err := n.Serve("sb", want, Policy{}); err != nil {
			t.Fatal(err)
		}
		if got := tenant(); got != want {
			t.Fatalf("served for %s, the proxy counts against %s", want, got)
		}
	}
	if err := n.Release("sb"); err != nil {
		t.Fatal(err)
	}
}
