package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
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
