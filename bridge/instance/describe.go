package instance

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
	"github.com/cireilclaw/sandbox-controller/runtimes"

	// Every path to an instance knows the backends this module ships.
	_ "github.com/cireilclaw/sandbox-controller/bridge/backend/all"
)

// Host are the facts of this host an instance is described with.
type Host struct {
	// AreasRoot holds one directory per agent.
	AreasRoot string
	// Home expands mount sources that begin with ~/.
	Home string
	// Identities hands each agent its host id. Nil means: the caller's own
	// id when it is not root, else ids of areas.DefaultIDRange allocated
	// in AreasRoot.
	Identities *areas.Identities
	// MountRoots, when not empty, are the directories the mount sources
	// must be resolved beneath (a SandboxClass's allowed roots, as written
	// and as the node resolves them): each source is anchored at the
	// longest that holds it. Empty: every source is resolved beneath "/".
	MountRoots []string
	// NetnsDir holds the network namespaces of the instances whose egress
	// is an allowlist, one file per instance; empty: egress Allowlist is
	// refused.
	NetnsDir string
	// EgressNets are the internal address ranges a Sandbox's proxy may
	// connect to (its class's allowedEgressNetworks).
	EgressNets []string
}

// Owner is what an instance records as the Sandbox that owns it.
func Owner(namespace, name string) string { return namespace + "/" + name }

// StandaloneOwner is what an instance of the standalone runner (sandboxctl,
// a sandbox.toml) records in place of the <namespace>/<name> of a Sandbox.
func StandaloneOwner(agent string) string { return "sandboxctl/" + agent }

// FromSandbox describes the instance of Sandbox sb. spec is sb's spec with
// its class applied (sandboxclass.Resolve); nil means sb.Spec as it is.
// It is pure: it reads the agent's host id and creates nothing; an agent
// that has none yet is ErrNotPrepared (Prepare, the Sandbox reconciler's
// step, gives it one). The description holds no git directory binds: only
// the Sandbox reconciler, which converges the instance and compares
// hashes, adds them (WithGitDirs). Every other caller (a claim's worktree,
// the exec API, the shutdown path) reads the instance's name, identity and
// mounts, and runs commands in the instance the driver recorded; it never
// compares this ConfigHash.
func FromSandbox(sb *v1alpha1.Sandbox, spec *v1alpha1.SandboxSpec, host Host) (runtimes.Instance, error) {
	if spec == nil {
		spec = &sb.Spec
	}
	return describe(Owner(sb.Namespace, sb.Name), spec, host)
}

// ErrNotPrepared is wrapped when the agent of a spec has no host identity
// and no areas yet: Prepare has not run for it.
var ErrNotPrepared = areas.ErrNoIdentity

// Prepare gives the agent of spec its host id and its directory of areas,
// laid out: the one step that creates, renames or chowns anything for an
// agent, taken by the Sandbox reconciler (and by Standalone) once the
// spec's class allows it. Describing is pure after it.
func Prepare(spec *v1alpha1.SandboxSpec, host Host) error {
	if !filepath.IsAbs(host.AreasRoot) {
		return fmt.Errorf("areas root %q must be an absolute path", host.AreasRoot)
	}
	id, err := identityFor(spec.Agent, host, true)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(runtimes.StandardAreas))
	for _, a := range runtimes.StandardAreas {
		names = append(names, a.Name)
	}
	if err := areas.Layout(filepath.Join(host.AreasRoot, spec.Agent), names, id.UID); err != nil {
		return fmt.Errorf("laying out the areas of agent %s: %w", spec.Agent, err)
	}
	return nil
}

// Standalone describes the instance of a sandbox configured without a
// Sandbox object (sandbox.toml), owned by StandaloneOwner. Having no
// reconciler, it prepares the agent first.
func Standalone(spec *v1alpha1.SandboxSpec, host Host) (runtimes.Instance, error) {
	if errs := backend.ValidateSpec(spec); len(errs) > 0 {
		return runtimes.Instance{}, fmt.Errorf("sandbox %s: %w", StandaloneOwner(spec.Agent), errs.ToAggregate())
	}
	if err := Prepare(spec, host); err != nil {
		return runtimes.Instance{}, err
	}
	return describe(StandaloneOwner(spec.Agent), spec, host)
}

// GitDirs are the git directories in bound, sorted.
func GitDirs(in runtimes.Instance) []string {
	var dirs []string
	for _, b := range in.Mounts {
		if b.GitDir {
			dirs = append(dirs, b.Source)
		}
	}
	slices.Sort(dirs)
	return dirs
}

// WithGitDirs is in with each of dirs bound at its own host path, as the
// git directories of worktrees, and its ConfigHash computed again. Only a
// directory inside one of in's read-write mount sources is bound, so no
// caller can widen what the sandbox sees; the drivers open each beneath
// its mount (runtimes.GitDir).
func WithGitDirs(in runtimes.Instance, dirs []string) runtimes.Instance {
	var binds []runtimes.Bind
	var seen []string
	for _, d := range dirs {
		d = filepath.Clean(d)
		if slices.Contains(seen, d) {
			continue
		}
		inside := slices.ContainsFunc(in.Mounts, func(m runtimes.Bind) bool {
			return !m.ReadOnly && !m.GitDir && strings.HasPrefix(d, m.Source+"/")
		})
		if !inside {
			continue
		}
		seen = append(seen, d)
		binds = append(binds, runtimes.Bind{Source: d, Target: d})
	}
	in.Mounts = slices.Clone(in.Mounts)
	in.AddBinds(binds...)
	return in
}

// WithPod puts in's processes in the cgroup of the Sandbox's Pod (on a
// cluster, so that the kubelet accounts for them); a new Pod is a new
// ConfigHash, and the instance starts again in it.
func WithPod(in runtimes.Instance, pod runtimes.Pod) runtimes.Instance {
	in.Pod = &pod
	in.ConfigHash = in.Hash()
	return in
}

// WithImageContainer gives a bwrap instance with an image the container
// whose root file system holds it (the Sandbox's Pod's, on a cluster); a
// new container is a new ConfigHash.
func WithImageContainer(in runtimes.Instance, id string) runtimes.Instance {
	in.ImageContainer = id
	in.ConfigHash = in.Hash()
	return in
}

// describe builds the Instance for a Sandbox spec. It applies the admission
// rules again (the API's and the backend's, backend.ValidateSpec) and
// refuses a spec that breaks one, so a CRD installed without its CEL rules
// cannot widen a sandbox.
func describe(owner string, spec *v1alpha1.SandboxSpec, host Host) (runtimes.Instance, error) {
	if errs := backend.ValidateSpec(spec); len(errs) > 0 {
		return runtimes.Instance{}, fmt.Errorf("sandbox %s: %w", owner, errs.ToAggregate())
	}
	if !filepath.IsAbs(host.AreasRoot) {
		return runtimes.Instance{}, fmt.Errorf("areas root %q must be an absolute path", host.AreasRoot)
	}
	agentDir := filepath.Join(host.AreasRoot, spec.Agent)
	id, err := identityFor(spec.Agent, host, false)
	if err != nil {
		return runtimes.Instance{}, err
	}
	in := runtimes.Instance{
		Identity: id,
		Name:     v1alpha1.InstanceName(spec.Agent),
		Agent:    spec.Agent,
		Owner:    owner,
		AgentDir: agentDir,
		Devices:  runtimes.Devices{USB: spec.Devices.USB, All: spec.Devices.All},
	}
	for _, a := range runtimes.StandardAreas {
		in.Areas = append(in.Areas, runtimes.Bind{Source: filepath.Join(agentDir, a.Name), Target: a.Target, ReadOnly: a.ReadOnly})
	}
	for _, m := range spec.Mounts {
		src := m.Source
		if strings.HasPrefix(src, "~/") {
			if host.Home == "" {
				return runtimes.Instance{}, fmt.Errorf("mount %q: source begins with ~/ but the controller has no home directory", m.Target)
			}
			src = filepath.Join(host.Home, src[2:])
		}
		dir, ok := areas.AnchorFor(src, host.MountRoots)
		if !ok {
			return runtimes.Instance{}, fmt.Errorf("mount %q: source %s lies below none of the allowed roots [%s]", m.Target, filepath.Clean(src), strings.Join(host.MountRoots, ", "))
		}
		dir.NoLinks = reachableByAgent(dir.Path, host, spec)
		b := runtimes.Bind{
			Source:   dir.Path,
			Anchor:   dir.Anchor,
			NoLinks:  dir.NoLinks,
			Target:   "/workspace/" + m.Target,
			ReadOnly: m.Mode != v1alpha1.MountReadWrite && m.Mode != v1alpha1.MountOverlay,
		}
		if m.Mode == v1alpha1.MountOverlay {
			l := overlay.For(agentDir, b.Source, m.Target)
			l.Owner = id.UID
			l.LowerAnchor, l.LowerNoLinks = b.Anchor, b.NoLinks
			if m.SizeLimit != nil {
				l = l.Sized(m.SizeLimit.Value())
			}
			b = runtimes.Bind{Source: l.Merged, Target: b.Target, Overlay: &l}
		}
		in.Mounts = append(in.Mounts, b)
	}
	sort.Slice(in.Mounts, func(i, j int) bool { return in.Mounts[i].Target < in.Mounts[j].Target })
	for _, b := range spec.Binaries {
		in.Binaries = append(in.Binaries, string(b))
	}
	sort.Strings(in.Binaries)
	for _, e := range spec.Env.Passthrough {
		in.Env = append(in.Env, string(e))
	}
	sort.Strings(in.Env)
	in.Resources = resources(spec)
	if in.Network, err = network(spec, host, in.Name); err != nil {
		return runtimes.Instance{}, err
	}
	describeBackend(spec, &in)
	in.ConfigHash = in.Hash()
	return in, nil
}

// reachableByAgent says whether an agent can write a directory on the way
// to source, a mount source of spec: source lies inside the areas root, or strictly inside another
// read-write mount's source of spec. No link is followed there (the seed:
// a mount source reachable through another mount cannot be moved and
// replaced with a symbolic link under the runtime).
func reachableByAgent(source string, host Host, spec *v1alpha1.SandboxSpec) bool {
	if strings.HasPrefix(source, filepath.Clean(host.AreasRoot)+"/") {
		return true
	}
	for _, m := range spec.Mounts {
		if m.Mode != v1alpha1.MountReadWrite {
			continue
		}
		other := m.Source
		if rest, ok := strings.CutPrefix(other, "~/"); ok {
			other = filepath.Join(host.Home, rest)
		}
		if strings.HasPrefix(source, filepath.Clean(other)+"/") {
			return true
		}
	}
	return false
}

// resources are spec's resources (the deprecated containerd limits read
// where they are unset) as the drivers take them; without a pids limit,
// v1alpha1.DefaultPidsLimit.
func resources(spec *v1alpha1.SandboxSpec) runtimes.Resources {
	r := spec.ResourcesOrDeprecated()
	out := runtimes.Resources{Pids: v1alpha1.DefaultPidsLimit}
	if r.PidsLimit != nil {
		out.Pids = *r.PidsLimit
	}
	if q := r.Limits.CPU; q != nil {
		out.CPUMillis = q.MilliValue()
	}
	if q := r.Limits.Memory; q != nil {
		out.MemoryBytes = q.Value()
	}
	if q := r.Requests.CPU; q != nil {
		out.CPURequestMillis = q.MilliValue()
	}
	if q := r.Requests.Memory; q != nil {
		out.MemoryRequestBytes = q.Value()
	}
	return out
}

// describeBackend lets the spec's backend add its own settings to in (its
// image and config). The spec is valid, so its backend is registered.
func describeBackend(spec *v1alpha1.SandboxSpec, in *runtimes.Instance) {
	if b, ok := backend.Lookup(spec.BackendOrDefault()); ok && b.Describe != nil {
		b.Describe(spec, in)
	}
}

// identityFor is the host identity of agent on host: read, or given when
// allocate is set (Prepare).
func identityFor(agent string, host Host, allocate bool) (runtimes.Identity, error) {
	ids := host.Identities
	if ids == nil {
		if uid := os.Geteuid(); uid != 0 {
			return runtimes.Identity{UID: uint32(uid), GID: uint32(os.Getegid())}, nil
		}
		var err error
		if ids, err = defaultIdentities(host.AreasRoot); err != nil {
			return runtimes.Identity{}, err
		}
	}
	var id uint32
	var err error
	if allocate {
		id, err = ids.For(agent)
	} else {
		id, err = ids.Lookup(agent)
	}
	if err != nil {
		return runtimes.Identity{}, fmt.Errorf("the host identity of agent %s: %w", agent, err)
	}
	return runtimes.Identity{UID: id, GID: id}, nil
}

var (
	defaultIDsMu sync.Mutex
	defaultIDs   = map[string]*areas.Identities{}
)

// defaultIdentities shares one allocator per areas root, so that agents
// described concurrently never race for one id.
func defaultIdentities(root string) (*areas.Identities, error) {
	defaultIDsMu.Lock()
	defer defaultIDsMu.Unlock()
	if ids := defaultIDs[root]; ids != nil {
		return ids, nil
	}
	ids, err := areas.NewIdentities(root, areas.DefaultIDRange)
	if err != nil {
		return nil, err
	}
	defaultIDs[root] = ids
	return ids, nil
}

// network describes the instance's network: nil (nothing beyond
// loopback) unless spec's egress is an allowlist, which gets a namespace
// of its own in host.NetnsDir and the proxy listening inside it.
func network(spec *v1alpha1.SandboxSpec, host Host, name string) (*runtimes.Network, error) {
	if spec.EgressOrDefault() != v1alpha1.EgressAllowlist {
		return nil, nil
	}
	if host.NetnsDir == "" {
		return nil, fmt.Errorf("spec.network.egress: Allowlist needs a network namespace of its own, which this controller does not make (it makes them only when it runs as root)")
	}
	n := &runtimes.Network{
		Namespace:   filepath.Join(host.NetnsDir, name),
		Proxy:       egress.ProxyURL,
		AllowedNets: slices.Clone(host.EgressNets),
	}
	for _, r := range spec.Network.Allow {
		rule := runtimes.EgressRule{Host: r.Host}
		for _, p := range r.Ports {
			rule.Ports = append(rule.Ports, int(p))
		}
		n.Allow = append(n.Allow, rule)
	}
	return n, nil
}

// EgressPolicy is the policy the proxy of network n holds requests to.
func EgressPolicy(n *runtimes.Network) (egress.Policy, error) {
	var p egress.Policy
	for _, r := range n.Allow {
		p.Rules = append(p.Rules, egress.Rule{Host: r.Host, Ports: r.Ports})
	}
	for _, s := range n.AllowedNets {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return egress.Policy{}, fmt.Errorf("allowedEgressNetworks: %q is not an address range in CIDR notation", s)
		}
		p.AllowedNets = append(p.AllowedNets, pr.Masked())
	}
	return p, nil
}
