// Package egress is a Sandbox's way out to the network when its egress is
// an allowlist: a proxy that takes HTTP CONNECT and plain HTTP requests,
// lets through only the hosts and ports the list names, resolves names
// itself and never dials an address inside the host's or the cluster's
// networks unless told to, and checks that a TLS connection is for the
// host it was opened for. Nothing here trusts the agent: every name, port,
// address and byte of a request is its.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ProxyPort is where a Sandbox's proxy listens on the loopback of its
// network namespace (each namespace has a loopback of its own), and
// ProxyURL what its commands are told. The port is below 1024, which only
// a process with CAP_NET_BIND_SERVICE over the namespace may bind: an
// agent's process that outlived a controller restart cannot take the
// proxy's place.
const (
	ProxyPort = 312
	ProxyURL  = "http://127.0.0.1:312"
)

// DefaultPorts are the ports a rule without ports allows.
var DefaultPorts = []int{443, 80}

// Rule is one allowed destination: Host is a name ("github.com"), a
// wildcard for every name below a domain ("*.pythonhosted.org", which does
// not match the domain itself), or an IP address, which is how an address
// literal is allowed; Ports are the ports allowed there (DefaultPorts when
// empty).
type Rule struct {
	Host  string
	Ports []int
}

// Policy is what a Sandbox may reach.
type Policy struct {
	Rules []Rule
	// AllowedNets are address ranges a name may resolve to although they
	// are internal (loopback, private, link-local, shared, multicast...),
	// as a SandboxClass may allow; none by default. They never open
	// NodeNets.
	AllowedNets []netip.Prefix
	// InternalNets are more ranges treated as internal, as the operator
	// knows them (a cluster's service and pod ranges outside the private
	// ones).
	InternalNets []netip.Prefix
	// NodeNets are the addresses of the node the proxy dials from
	// (Networks.RefuseHostAddresses): never reachable, whatever
	// AllowedNets says. A connection to one reaches every service bound on
	// the node (the kubelet, the controller's own listeners) and comes
	// from the node itself, past firewall rules for remote traffic; a
	// class range written for a lab or cluster network (10.0.0.0/8) must
	// not open the node inside it.
	NodeNets []netip.Prefix
	// NodeRoutes also refuses, at the moment of connecting, every address
	// the kernel then routes to this host (Networks.RefuseHostAddresses):
	// one the node gained after NodeNets was read, a range routed to
	// loopback.
	NodeRoutes bool
}

// CheckRule says what is wrong with r, or nil: the rules admission holds
// an allowlist entry to.
func CheckRule(r Rule) error {
	h := r.Host
	if h == "" {
		return errors.New("the host is empty")
	}
	for _, p := range r.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("port %d is not between 1 and 65535", p)
		}
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("%q: an address with a zone names an interface of the host", h)
		}
		return nil
	}
	name := strings.TrimPrefix(h, "*.")
	if strings.Contains(name, "*") {
		return fmt.Errorf("%q: a wildcard is only allowed as the first label (*.example.com)", h)
	}
	if len(name) > 253 {
		return fmt.Errorf("%q is longer than 253 characters", h)
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return fmt.Errorf("%q is not a domain name with at least two labels", h)
	}
	for _, l := range labels {
		if !validLabel(l) {
			return fmt.Errorf("%q: label %q must be 1 to 63 lowercase letters, digits or '-', not starting or ending with '-'", h, l)
		}
	}
	return nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, c := range l {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Allows says whether the policy lets a connection to host:port through.
// host is as the request named it; names compare without case and without
// a trailing dot. An address literal is allowed only by a rule naming that
// address.
func (p Policy) Allows(host string, port int) bool {
	host = normalHost(host)
	_, err := netip.ParseAddr(host)
	literal := err == nil
	for _, r := range p.Rules {
		if !slices.Contains(portsOf(r), port) {
			continue
		}
		rh := normalHost(r.Host)
		switch {
		case rh == host:
			return true
		case literal:
		case strings.HasPrefix(rh, "*.") && strings.HasSuffix(host, rh[1:]) && len(host) > len(rh)-1:
			return true
		}
	}
	return false
}

func portsOf(r Rule) []int {
	if len(r.Ports) == 0 {
		return DefaultPorts
	}
	return r.Ports
}

// normalHost is host in lower case, without brackets or a trailing dot.
func normalHost(host string) string {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// internalNets are the ranges a name is never let resolve to unless the
// policy allows them: this host, its and the cluster's private networks,
// link-local (cloud metadata at 169.254.169.254), shared address space,
// multicast and the unspecified and reserved ones, and Azure's WireServer
// (168.63.129.16, a public address that serves a node's secrets to it).
var internalNets = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "168.63.129.16/32", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15",
	"224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
	"::/96", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2002::/16",
	"fc00::/7", "fe80::/10", "ff00::/8",
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// nodeNets are the addresses that are the node itself on every host, its
// interfaces' aside: all of loopback, and the unspecified addresses,
// which Linux connects to the host's own listeners.
var nodeNets = mustPrefixes("0.0.0.0/8", "127.0.0.0/8", "::/128", "::1/128")

// reach is whether an address is reachable, and why not.
type reach int

const (
	addrReachable reach = iota
	// addrInternal is internal and no AllowedNets range opens it.
	addrInternal
	// addrOfNode is the node's own (NodeNets), which nothing opens.
	addrOfNode
)

// Reachable says whether the policy lets a connection go to addr: any
// public address outside InternalNets, an internal one only inside
// AllowedNets, and never one of NodeNets.
func (p Policy) Reachable(addr netip.Addr) bool {
	return p.reach(addr) == addrReachable
}

func (p Policy) reach(addr netip.Addr) reach {
	addr = addr.Unmap()
	if containsAddr(p.NodeNets, addr) {
		return addrOfNode
	}
	if containsAddr(p.AllowedNets, addr) {
		return addrReachable
	}
	if containsAddr(internalNets, addr) || containsAddr(p.InternalNets, addr) || !addr.IsValid() {
		return addrInternal
	}
	return addrReachable
}

func containsAddr(nets []netip.Prefix, addr netip.Addr) bool {
	return slices.ContainsFunc(nets, func(n netip.Prefix) bool { return n.Contains(addr) })
}

// splitHostPort is host and port of hostport, with defaultPort when it has
// none.
func splitHostPort(hostport string, defaultPort int) (string, int, error) {
	host, portStr := hostport, ""
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && !strings.HasSuffix(hostport, "]") {
		host, portStr = hostport[:i], hostport[i+1:]
	}
	host = normalHost(host)
	if host == "" {
		return "", 0, fmt.Errorf("no host in %s", clip(hostport))
	}
	if portStr == "" {
		if defaultPort == 0 {
			return "", 0, fmt.Errorf("no port in %s", clip(hostport))
		}
		return host, defaultPort, nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %s", clip(hostport))
	}
	return host, port, nil
}

// Covers says whether pattern, an entry of a class's allowed hosts,
// covers host, a Sandbox's rule: "*" covers every host, a name itself,
// and "*.d" every name and wildcard below d (not d itself, as the rule it
// would be does not match d, and never an address).
func Covers(pattern, host string) bool {
	pattern, host = normalHost(pattern), normalHost(host)
	switch {
	case pattern == "*", pattern == host:
		return true
	case strings.HasPrefix(pattern, "*."):
		if _, err := netip.ParseAddr(host); err == nil {
			// An address is covered only by itself or "*".
			return false
		}
		return strings.HasSuffix(host, pattern[1:]) && len(host) > len(pattern)-1
	}
	return false
}

// HostAddresses are the addresses of this host's interfaces, each a
// range of one: a proxy dials from the host, so a public address of the
// host would reach services that trust the host itself.
func HostAddresses() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out, nil
}
