package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
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
			status, body := connectToNode(t, n, a, serveOnce(t, a))
			if status != http.StatusForbidden {
				t.Fatalf("CONNECT to this node's %s under a class range covering it: %d, want 403", a, status)
			}
			for _, want := range []string{"this node's own", "allowedEgressNetworks"} {
				if !strings.Contains(body, want) {
					t.Errorf("the refusal %q does not say %q", body, want)
				}
			}
		})
	}
}

// connectToNode asks a proxy of n, under a class range covering every
// address, for a tunnel to port of a listed name resolving to a; it
// answers the status and the start of the body.
func connectToNode(t *testing.T, n *Networks, a netip.Addr, port int) (int, string) {
	t.Helper()
	pol := n.withInternal(Policy{Rules: []Rule{{Host: "node.example", Ports: []int{port}}}, AllowedNets: everywhere})
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
	fmt.Fprintf(c, "CONNECT node.example:%d HTTP/1.1\r\nHost: node.example\r\n\r\n", port)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := make([]byte, 512)
	k, _ := resp.Body.Read(body)
	return resp.StatusCode, string(body[:k])
}

// serveOnce listens on a and answers every connection with a line, until
// the test ends; it answers the port.
func serveOnce(t *testing.T, a netip.Addr) int {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
	if err != nil {
		t.Fatalf("cannot listen on this node's %s: %v", a, err)
	}
	t.Cleanup(func() { l.Close() })
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
	return l.Addr().(*net.TCPAddr).Port
}

// An address the node gains after its proxies learnt its addresses (a
// new interface, a failover address, a range routed to loopback) is the
// node's all the same: the proxy asks the kernel as it connects.
func TestProxyNeverConnectsToAnAddressTheNodeGainedLater(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "run as root: the test adds an address to this host")
	}
	ipCmd := testenv.Binary(t, "ip", "install iproute2 (hack/install-deps.sh)")
	n := nodeNetworks(t)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ipCmd, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, c := range []struct {
		name     string
		add, del []string
		addr     netip.Addr
	}{
		{"an address added to an interface", []string{"addr", "add", "198.18.77.7/32", "dev", "lo"}, []string{"addr", "del", "198.18.77.7/32", "dev", "lo"}, netip.MustParseAddr("198.18.77.7")},
		{"a range routed to loopback", []string{"route", "add", "local", "198.18.78.0/24", "dev", "lo"}, []string{"route", "del", "local", "198.18.78.0/24", "dev", "lo"}, netip.MustParseAddr("198.18.78.9")},
	} {
		t.Run(c.name, func(t *testing.T) {
			if n.withInternal(Policy{}).reach(c.addr) == addrOfNode {
				t.Fatalf("%s is already among the node's addresses read at the start", c.addr)
			}
			ip(c.add...)
			t.Cleanup(func() { _ = exec.Command(ipCmd, c.del...).Run() })
			port := serveOnce(t, c.addr)
			status, body := connectToNode(t, n, c.addr, port)
			if status != http.StatusForbidden || !strings.Contains(body, "this node's own") {
				t.Fatalf("CONNECT to %s, which the node gained after its proxies started: %d %q, want 403 naming the node's own address", c.addr, status, body)
			}
		})
	}
}
