package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Networks keeps the network namespaces of the instances whose egress is
// an allowlist, each in a file of Dir named after its instance, and serves
// each one's proxy inside it. A namespace outlives the process serving it
// (a controller restarting adopts it and listens in it again) until
// Release.
type Networks struct {
	// Dir holds the namespaces' files.
	Dir string
	// Resolver resolves names for every proxy; nil: the host's resolver.
	Resolver Resolver
	// MaxConns and IdleTimeout bound every proxy (Proxy's defaults when
	// zero).
	MaxConns    int
	IdleTimeout time.Duration
	// Shared bounds the connections of every proxy together, and those of
	// each tenant's proxies to its share (none when nil).
	Shared *Slots
	// BytesPerSecond bounds each proxy's traffic, each way (none when
	// zero).
	BytesPerSecond int64
	// InternalNets are added to every policy's (Policy.InternalNets).
	InternalNets []netip.Prefix
	// NodeNets are added to every policy's (Policy.NodeNets): the node's
	// own addresses, as RefuseHostAddresses finds them.
	NodeNets []netip.Prefix
	// OnDecision, when set, hears of every request of every proxy, with
	// the name of the instance it was for.
	OnDecision func(name string, d Decision)

	// nodeRoutes: RefuseHostAddresses was called, and every proxy also
	// asks the kernel (Policy.NodeRoutes).
	nodeRoutes bool

	mu     sync.Mutex
	served map[string]*served
}

type served struct {
	proxy *Proxy
	l     net.Listener
	// tenant is the namespace of the Sandbox served, whose share of
	// Shared its connections count against.
	tenant string
	// ino is the namespace of a runtime's own (ServeIn), which may be
	// replaced when its instance restarts; 0 for one of Dir.
	ino uint64
}

// nsfsMagic is the file system type of a namespace file.
const nsfsMagic = 0x6e736673

// Serve makes sure the namespace of instance name exists and its proxy
// serves pol there for tenant (the namespace of the Sandbox it is for); a
// proxy already serving tenant takes pol for its next requests, one
// serving another tenant is replaced. It returns the namespace's path.
func (n *Networks) Serve(name, tenant string, pol Policy) (string, error) {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return "", fmt.Errorf("network namespace name %q is not a file name", name)
	}
	path := filepath.Join(n.Dir, name)
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.served[name]; ok {
		if s.tenant == tenant {
			s.proxy.SetPolicy(n.withInternal(pol))
			return path, nil
		}
		s.stop()
		delete(n.served, name)
	}
	if err := os.MkdirAll(n.Dir, 0o700); err != nil {
		return "", fmt.Errorf("the network namespaces' directory: %w", err)
	}
	l, err := n.listen(path)
	if err != nil {
		return "", err
	}
	n.start(name, tenant, l, pol, 0)
	return path, nil
}

// listen opens the proxy's listener inside the namespace held at path,
// adopting it when it exists and making it when it does not.
func (n *Networks) listen(path string) (net.Listener, error) {
	var fs unix.Statfs_t
	err := unix.Statfs(path, &fs)
	switch {
	case err == nil && fs.Type == nsfsMagic:
		ns := Namespace{Path: path}
		var l net.Listener
		err := ns.Run(func() error {
			var err error
			l, err = net.Listen("tcp4", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), ProxyPort).String())
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("listening in network namespace %s: %w", path, err)
		}
		return l, nil
	case err == nil:
		// A file left by a start that failed before holding the namespace.
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing %s, which holds no network namespace: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	_, l, err := NewNamespace(path, ProxyPort)
	return l, err
}

// ServeIn serves pol for tenant in a network namespace a runtime made for
// instance name (an Incus container's, ns the open namespace of its init,
// which the caller keeps and closes), bringing its loopback up; the
// namespace is not held here and not removed by Release. A namespace that
// changed (the instance restarted), or another tenant, gets a new
// listener.
func (n *Networks) ServeIn(name, tenant string, ns *os.File, pol Policy) error {
	fd := int(ns.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("the network namespace of %s: %w", name, err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != nsfsMagic {
		return fmt.Errorf("%s is not a namespace", ns.Name())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.served[name]; ok {
		if s.ino == st.Ino && s.tenant == tenant {
			s.proxy.SetPolicy(n.withInternal(pol))
			return nil
		}
		s.stop()
		delete(n.served, name)
	}
	var l net.Listener
	err := inNamespace(fd, func() error {
		if err := loopbackUp(); err != nil {
			return err
		}
		var err error
		l, err = net.Listen("tcp4", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), ProxyPort).String())
		return err
	})
	if err != nil {
		return fmt.Errorf("listening in the network namespace of %s: %w", name, err)
	}
	n.start(name, tenant, l, pol, st.Ino)
	return nil
}

// start serves pol on l for instance name of tenant.
func (n *Networks) start(name, tenant string, l net.Listener, pol Policy, ino uint64) {
	pol = n.withInternal(pol)
	p := &Proxy{Policy: pol, Resolver: n.Resolver, MaxConns: n.MaxConns, IdleTimeout: n.IdleTimeout, BytesPerSecond: n.BytesPerSecond, Shared: n.Shared, Tenant: tenant}
	if n.OnDecision != nil {
		p.OnDecision = func(d Decision) { n.OnDecision(name, d) }
	}
	if n.served == nil {
		n.served = map[string]*served{}
	}
	n.served[name] = &served{proxy: p, l: l, tenant: tenant, ino: ino}
	go func() { _ = p.Serve(l) }()
}

// stop ends everything the proxy serves (Proxy.Stop: its open tunnels,
// plain requests and dials too, which a closed listener alone would leave
// running with the old policy) and closes its listener.
func (s *served) stop() {
	s.proxy.Stop()
	_ = s.l.Close()
}

// Release stops name's proxy and lets its namespace go once no process
// is in it.
func (n *Networks) Release(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.served[name]; ok {
		s.stop()
		delete(n.served, name)
	}
	ns := Namespace{Path: filepath.Join(n.Dir, name)}
	return ns.Remove()
}

// Names lists the namespaces held in Dir, served or not.
func (n *Networks) Names() ([]string, error) {
	ents, err := os.ReadDir(n.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

// Close stops every proxy and keeps the namespaces, for the next process
// to adopt.
func (n *Networks) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, s := range n.served {
		s.stop()
		delete(n.served, name)
	}
}

// Prune removes the namespaces that no proxy of this process serves and
// keep does not keep, and names them.
func (n *Networks) Prune(keep func(name string) bool) []string {
	names, err := n.Names()
	if err != nil {
		return nil
	}
	var out []string
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		if _, serving := n.served[name]; serving || keep(name) {
			continue
		}
		ns := Namespace{Path: filepath.Join(n.Dir, name)}
		if ns.Remove() == nil {
			out = append(out, name)
		}
	}
	return out
}

// RefuseHostAddresses adds this host's own addresses to NodeNets: all of
// loopback, the unspecified addresses and its interfaces' addresses; and
// has every proxy refuse, as it connects, any address the kernel routes to
// this host then (Policy.NodeRoutes), such as one gained later. A
// permitted name resolving to one would reach the host's own services,
// whatever range a class allows. Every Networks that serves Sandboxes
// calls it; only tests whose servers listen on loopback leave it out.
func (n *Networks) RefuseHostAddresses() error {
	own, err := HostAddresses()
	if err != nil {
		return fmt.Errorf("this host's own addresses, which egress proxies must not reach: %w", err)
	}
	n.NodeNets = append(append(n.NodeNets, nodeNets...), own...)
	n.nodeRoutes = true
	return nil
}

// withInternal is pol with the operator's internal ranges and the node's
// own addresses added.
func (n *Networks) withInternal(pol Policy) Policy {
	pol.InternalNets = append(slices.Clip(pol.InternalNets), n.InternalNets...)
	pol.NodeNets = append(slices.Clip(pol.NodeNets), n.NodeNets...)
	pol.NodeRoutes = pol.NodeRoutes || n.nodeRoutes
	return pol
}
