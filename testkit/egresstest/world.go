// Package egresstest is the outside world of the egress tests, on this
// machine alone: an HTTP and an HTTPS server of the test's own on
// 127.0.0.2, names resolved by the proxy to them or to addresses it must
// refuse, and a probe that runs inside a sandbox and tries every way out.
// Every backend's suite runs the same probe and holds it to the same
// expectations.
package egresstest

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
)

// The names of the world. Allowed and Wildcard (below *.example.com) are
// listed and resolve to the servers; Unlisted resolves to them too but is
// not listed; Loopback and Private are listed but resolve to addresses no
// Sandbox may reach.
const (
	Allowed  = "example.com"
	Wildcard = "www.example.com"
	Unlisted = "example.org"
	Loopback = "loop.example.net"
	Private  = "private.example.net"
	// ServerAddr is where the servers listen, the one internal address
	// the test's class allows (ServerNet).
	ServerAddr = "127.0.0.2"
	ServerNet  = "127.0.0.2/32"
	// Body is what the servers answer.
	Body = "hello from the allowed host"
)

// World is the servers and the names.
type World struct {
	HTTP, HTTPS *httptest.Server
	// CA is the HTTPS server's certificate, PEM, for the probe to trust.
	CA string
}

// New starts the servers; Close stops them.
func New() (*World, error) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, Body) })
	w := &World{HTTP: httptest.NewUnstartedServer(handler), HTTPS: httptest.NewUnstartedServer(handler)}
	for _, s := range []*httptest.Server{w.HTTP, w.HTTPS} {
		l, err := net.Listen("tcp4", ServerAddr+":0")
		if err != nil {
			return nil, fmt.Errorf("listening on %s (loopback answers all of 127.0.0.0/8 on Linux): %w", ServerAddr, err)
		}
		s.Listener = l
	}
	w.HTTP.Start()
	w.HTTPS.StartTLS()
	w.CA = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.HTTPS.Certificate().Raw}))
	return w, nil
}

// Close stops the servers.
func (w *World) Close() {
	w.HTTP.Close()
	w.HTTPS.Close()
}

// Ports are the servers' ports.
func (w *World) Ports() (httpPort, httpsPort int32) {
	return int32(w.HTTP.Listener.Addr().(*net.TCPAddr).Port), int32(w.HTTPS.Listener.Addr().(*net.TCPAddr).Port)
}

// Resolver resolves the world's names, and no other.
func (w *World) Resolver() egress.Resolver { return names{} }

type names struct{}

func (names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	host = strings.TrimSuffix(host, ".") // the proxy asks for absolute names
	switch host {
	case Allowed, Wildcard, Unlisted:
		return []netip.Addr{netip.MustParseAddr(ServerAddr)}, nil
	case Loopback:
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	case Private:
		return []netip.Addr{netip.MustParseAddr("10.9.8.7")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// Allowlist is the Sandbox's network: the allowed names and the two that
// resolve inside, on the servers' ports.
func (w *World) Allowlist() *v1alpha1.Network {
	h, s := w.Ports()
	ports := []int32{h, s}
	return &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist, Allow: []v1alpha1.EgressRule{
		{Host: Allowed, Ports: ports}, {Host: "*.example.com", Ports: ports},
		{Host: Loopback, Ports: ports}, {Host: Private, Ports: ports},
	}}
}

// Class allows the world's hosts and its servers' address, and the
// backends given; Sandboxes name it (it is not the default, so the
// suite's other Sandboxes are not held to it).
func Class(name string, backends ...v1alpha1.Backend) *v1alpha1.SandboxClass {
	c := &v1alpha1.SandboxClass{Spec: v1alpha1.SandboxClassSpec{
		AllowedBackends:       backends,
		AllowedEgress:         []string{Allowed, "*.example.com", Loopback, Private},
		AllowedEgressNetworks: []string{ServerNet},
		AllowedImages:         v1alpha1.ClassImages{Bwrap: []string{"*"}, Containerd: []string{"*"}, Incus: []string{"*"}},
	}}
	c.Name = name
	return c
}

// Probe is a python3 program that tries every way out and prints one
// "name: reached|refused detail" line per try. Arguments: the HTTP port,
// the HTTPS port and the CA. It uses the proxy only through the
// environment, as tools do.
const Probe = `
import os, socket, ssl, sys, urllib.request
hp, sp, ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cadata=ca)
ctx.check_hostname = False
def get(name, url):
    try:
        body = urllib.request.urlopen(url, timeout=10, context=ctx if url.startswith("https") else None).read().decode()
        print("%s: reached %s" % (name, body))
    except Exception as e:
        print("%s: refused %s" % (name, str(e).replace("\n", " ")))
get("http-allowed", "http://example.com:%d/" % hp)
get("https-allowed", "https://example.com:%d/" % sp)
get("https-wildcard", "https://www.example.com:%d/" % sp)
get("http-unlisted", "http://example.org:%d/" % hp)
get("https-unlisted", "https://example.org:%d/" % sp)
get("ip-literal", "http://127.0.0.2:%d/" % hp)
get("resolves-to-loopback", "http://loop.example.net:%d/" % hp)
get("resolves-to-private", "http://private.example.net:%d/" % hp)
# A TLS stream whose server name is not the host CONNECT named.
try:
    proxy = os.environ.get("HTTPS_PROXY", "http://127.0.0.1:1").rsplit(":", 1)
    s = socket.create_connection((proxy[0].split("//")[-1], int(proxy[1])), timeout=10)
    s.sendall(("CONNECT example.com:%d HTTP/1.1\r\nHost: example.com:%d\r\n\r\n" % (sp, sp)).encode())
    head = s.recv(4096).decode()
    if " 200 " not in head.split("\r\n")[0]:
        raise Exception(head.split("\r\n")[0])
    t = ctx.wrap_socket(s, server_hostname="example.org")
    t.sendall(b"GET / HTTP/1.1\r\nHost: example.org\r\nConnection: close\r\n\r\n")
    print("sni-mismatch: reached %s" % t.recv(4096).decode().split("\r\n\r\n", 1)[-1])
except Exception as e:
    print("sni-mismatch: refused %s" % str(e).replace("\n", " "))
# Straight to the server, ignoring the proxy.
try:
    socket.create_connection(("127.0.0.2", hp), timeout=5).close()
    print("direct: reached")
except Exception as e:
    print("direct: refused %s" % e)
try:
    socket.create_connection(("192.0.2.1", 80), timeout=5).close()
    print("direct-outside: reached")
except Exception as e:
    print("direct-outside: refused %s" % e)
`

// ProbeArgs are the python3 probe's command for w.
func (w *World) ProbeArgs() []string {
	h, s := w.Ports()
	return []string{"python3", "-c", Probe, fmt.Sprint(h), fmt.Sprint(s), w.CA}
}

// ProbeCommand is the name of the static probe (egresstest/probe) in the
// containerd test image.
const ProbeCommand = "egress-probe"

// StaticProbeArgs are the static probe's command for w.
func (w *World) StaticProbeArgs() []string {
	h, s := w.Ports()
	return []string{ProbeCommand, fmt.Sprint(h), fmt.Sprint(s), w.CA}
}

// AllowlistReaches are the tries an allowlist Sandbox must get through;
// every other one must be refused. A Sandbox with egress None reaches none.
var AllowlistReaches = []string{"http-allowed", "https-allowed", "https-wildcard"}

// Check holds the probe's output to what a Sandbox with egress mode
// reaches, and says what differs ("" when nothing does).
func Check(out string, mode v1alpha1.EgressMode) string {
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, rest, ok := strings.Cut(line, ": ")
		if ok {
			got[name] = rest
		}
	}
	var bad []string
	for _, name := range []string{"http-allowed", "https-allowed", "https-wildcard", "http-unlisted", "https-unlisted",
		"ip-literal", "resolves-to-loopback", "resolves-to-private", "sni-mismatch", "direct", "direct-outside"} {
		r, ok := got[name]
		if !ok {
			bad = append(bad, name+": no answer")
			continue
		}
		want := mode == v1alpha1.EgressAllowlist && slices.Contains(AllowlistReaches, name)
		switch {
		case want && r != "reached "+Body:
			bad = append(bad, fmt.Sprintf("%s: want reached %q, got %q", name, Body, r))
		case !want && !strings.HasPrefix(r, "refused"):
			bad = append(bad, fmt.Sprintf("%s: want refused, got %q", name, r))
		}
	}
	sort.Strings(bad)
	return strings.Join(bad, "\n")
}
