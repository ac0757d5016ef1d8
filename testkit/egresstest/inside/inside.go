// Package inside is a client inside an instance's network namespace, of
// the egress proxy listening there, and a server the proxy may be allowed
// to reach: for the tests that a proxy serves the list it was given, and
// nothing once released. It imports no controller, so the controllers'
// own tests use it.
package inside

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/cireilclaw/sandbox-controller/internal/egress"
)

// The server's name, address and answer. A policy allows Host and
// ServerNet (an internal address) to reach it.
const (
	Host       = "allowed.example"
	ServerAddr = "127.0.0.2"
	ServerNet  = "127.0.0.2/32"
	Body       = "reached the allowed host"
)

// Server is a plain HTTP server on ServerAddr, which Resolver names Host.
type Server struct{ s *httptest.Server }

// NewServer starts the server; Close stops it.
func NewServer() (*Server, error) {
	l, err := net.Listen("tcp4", ServerAddr+":0")
	if err != nil {
		return nil, fmt.Errorf("listening on %s (loopback answers all of 127.0.0.0/8 on Linux): %w", ServerAddr, err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, Body) }))
	s.Listener = l
	s.Start()
	return &Server{s: s}, nil
}

// Close stops the server.
func (s *Server) Close() { s.s.Close() }

// Port is the server's port.
func (s *Server) Port() int { return s.s.Listener.Addr().(*net.TCPAddr).Port }

// Resolver resolves Host to the server, and no other name.
func (s *Server) Resolver() egress.Resolver { return names{} }

type names struct{}

func (names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if strings.TrimSuffix(host, ".") == Host {
		return []netip.Addr{netip.MustParseAddr(ServerAddr)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// Through is a client inside the network namespace of an instance's
// proxy. It holds the namespace by a descriptor, so that it is entered
// still after the proxy's release removed its file.
type Through struct {
	srv *Server
	f   *os.File
	ns  egress.Namespace
}

// Enter opens the namespace at nsPath, whose proxy may reach srv; Close
// lets it go.
func Enter(nsPath string, srv *Server) (*Through, error) {
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("holding network namespace %s: %w", nsPath, err)
	}
	return &Through{srv: srv, f: f, ns: egress.Namespace{Path: fmt.Sprintf("/proc/self/fd/%d", f.Fd())}}, nil
}

// Close lets the namespace go.
func (t *Through) Close() { _ = t.f.Close() }

// Tunnel is a CONNECT tunnel through the proxy to the server, under
// Host.
type Tunnel struct {
	c  net.Conn
	br *bufio.Reader
}

// Close closes the tunnel.
func (tu *Tunnel) Close() { _ = tu.c.Close() }

// Tunnel opens a tunnel from inside the namespace (its socket is the
// namespace's) and checks that it reaches the server.
func (t *Through) Tunnel() (*Tunnel, error) {
	c, err := t.dial()
	if err != nil {
		return nil, err
	}
	target := fmt.Sprintf("%s:%d", Host, t.srv.Port())
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	tu := &Tunnel{c: c, br: bufio.NewReader(c)}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(tu.br, &http.Request{Method: http.MethodConnect})
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("CONNECT %s: %s", target, resp.Status)
		}
	}
	if err == nil {
		err = tu.Get()
	}
	if err != nil {
		tu.Close()
		return nil, err
	}
	return tu, nil
}

// Get sends a request through the open tunnel; nil when the server
// answered it.
func (tu *Tunnel) Get() error {
	_ = tu.c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = tu.c.SetDeadline(time.Time{}) }()
	fmt.Fprintf(tu.c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", Host)
	resp, err := http.ReadResponse(tu.br, nil)
	if err != nil {
		return fmt.Errorf("through the tunnel: %w", err)
	}
	defer resp.Body.Close()
	b, _ := readAnswer(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != Body {
		return fmt.Errorf("through the tunnel: %s %q", resp.Status, b)
	}
	return nil
}

// Get sends a plain request for Host to the proxy from inside the
// namespace; nil when the server answered it.
func (t *Through) Get() error {
	c, err := t.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET http://%s:%d/ HTTP/1.1\r\nHost: %s\r\n\r\n", Host, t.srv.Port(), Host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("through the proxy: %w", err)
	}
	defer resp.Body.Close()
	b, _ := readAnswer(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != Body {
		return fmt.Errorf("through the proxy: %s %q", resp.Status, b)
	}
	return nil
}

// dial connects to the proxy's port from inside the namespace.
func (t *Through) dial() (net.Conn, error) {
	var c net.Conn
	err := t.ns.Run(func() error {
		var err error
		c, err = net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", egress.ProxyPort), 5*time.Second)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to the proxy inside the namespace: %w", err)
	}
	return c, nil
}

// readAnswer reads an answer's body, at most a little more than Body: a
// proxy's refusal is short, and what the test's own server sends is Body.
func readAnswer(r io.Reader) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r, int64(len(Body))+4096))
}
