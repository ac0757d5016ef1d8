package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// everywhere is a class range that covers every address there is.
var everywhere = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// nodeNetworks is a Networks told of this host's own addresses, as the
// controller's and sandboxctl's are.
func nodeNetworks(t *testing.T) *Networks {
	t.Helper()
	n := &Networks{}
	if err := n.RefuseHostAddresses(); err != nil {
		t.Fatal(err)
	}
	return n
}

// A proxy dials from the node, so the node's own addresses reach every
// service bound on it (the kubelet, the controller's own listeners), as
// the node and past any firewall rule for remote traffic: no class range
// opens them, however wide, and loopback is the node on every address.
func TestClassRangesNeverOpenTheNode(t *testing.T) {
	n := nodeNetworks(t)
	own, err := HostAddresses()
	if err != nil {
		t.Fatal(err)
	}
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("::")}
	for _, p := range own {
		addrs = append(addrs, p.Addr())
	}
	opened := 0
	for _, a := range addrs {
		for _, allowed := range [][]netip.Prefix{everywhere, {netip.PrefixFrom(a, a.BitLen())}} {
			if n.withInternal(Policy{AllowedNets: allowed}).Reachable(a) {
				opened++
				t.Errorf("this node's %s is reachable with the class ranges %v", a, allowed)
			}
		}
	}
	if opened > 0 {
		t.Logf("%d of %d (address, class range) pairs opened the node", opened, 2*len(addrs))
	}
}

// Through the proxy: a listener on an address of the node, a listed name
// resolving to it, a class range covering it; the proxy refuses, saying
// the address is the node's own and that class ranges do not open it.
func TestProxyNeverConnectsToTheNode(t *testing.T) {
	n := nodeNetworks(t)
	own, err := HostAddresses()
	if err != nil {
		t.Fatal(err)
	}
	targets := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	for _, p := range own {
		if a := p.Addr(); !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			targets = append(targets, a)
			break
		}
	}
	for _, a := range targets {
		t.Run(a.String(), func(t *testing.T) {
			l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
			if err != nil {
				t.Fatalf("cannot listen on this node's %s: %v", a, err)
			}
			defer l.Close()
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					fmt.Fprint(c, "a service of the node")
					c.Close()
				}
			}()
			dest := l.Addr().(*net.TCPAddr).Port
			pol := n.withInternal(Policy{Rules: []Rule{{Host: "node.example", Ports: []int{dest}}}, AllowedNets: everywhere})
			p := &Proxy{Policy: pol, Resolver: names{"node.example": {a}}}
			pl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer pl.Close()
			go func() { _ = p.Serve(pl) }()
			c, err := net.Dial("tcp", pl.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "CONNECT node.example:%d HTTP/1.1\r\nHost: node.example\r\n\r\n", dest)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("CONNECT to this node's %s under a class range covering it: %s, want 403", a, resp.Status)
			}
			body := make([]byte, 512)
			k, _ := resp.Body.Read(body)
			for _, want := range []string{"this node's own", "allowedEgressNetworks"} {
				if !strings.Contains(string(body[:k]), want) {
					t.Errorf("the refusal %q does not say %q", body[:k], want)
				}
			}
		})
	}
}
