package bwrap_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// exampleCom resolves example.com to this host's loopback, where the
// test's server listens.
type exampleCom struct{}

func (exampleCom) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	host = strings.TrimSuffix(host, ".") // the proxy asks for absolute names
	if host == "example.com" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// probe runs inside the sandbox: a direct connection to the server, one
// to an outside address, then a request through the proxy.
const probe = `
import socket, sys
server, proxy = int(sys.argv[1]), int(sys.argv[2])
for addr in (("127.0.0.1", server), ("192.0.2.1", 80)):
    try:
        socket.create_connection(addr, timeout=3).close()
        print("direct %s:%d reached" % addr)
    except OSError as e:
        print("direct %s:%d refused" % addr)
s = socket.create_connection(("127.0.0.1", proxy), timeout=10)
s.sendall(("GET http://example.com:%d/ HTTP/1.1\r\nHost: example.com:%d\r\n\r\n" % (server, server)).encode())
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
print(data.decode().split("\r\n\r\n", 1)[-1])
`

// A command of an instance with a network namespace has no way out but
// the proxy listening in it: the host's loopback and outside addresses
// are unreachable, and the proxy reaches an allowed server.
func TestCommandsRunInTheInstanceNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "network namespaces need root: run the tests as root (CI does)")
	}
	testenv.Binary(t, "python3", "install python3")
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "reached through the proxy") }))
	defer host.Close()
	serverPort := host.Listener.Addr().(*net.TCPAddr).Port

	ns, l, err := egress.NewNamespace(filepath.Join(t.TempDir(), "net"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Remove() }()
	defer l.Close()
	p := &egress.Proxy{
		Policy:   egress.Policy{Rules: []egress.Rule{{Host: "example.com", Ports: []int{serverPort}}}, AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		Resolver: exampleCom{},
	}
	go func() { _ = p.Serve(l) }()
	proxyPort := l.Addr().(*net.TCPAddr).Port

	s := newSandbox(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"python3"}}, nil, bwrap.Host{})
	in := s.in
	in.Network = &runtimes.Network{Namespace: ns.Path}
	in.ConfigHash = in.Hash()
	if _, err := s.rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := s.exec(t, "python3", "-c", probe, fmt.Sprint(serverPort), fmt.Sprint(proxyPort))
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, stderr)
	}
	for _, want := range []string{
		fmt.Sprintf("direct 127.0.0.1:%d refused", serverPort),
		"direct 192.0.2.1:80 refused",
		"reached through the proxy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the sandbox: %q lacks %q", out, want)
		}
	}
}
