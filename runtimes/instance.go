package runtimes

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
)

// StandardAreas are the standard areas of an agent, in the order the seed lists them.
var StandardAreas = []AreaSpec{
	{Name: "workspace", Target: "/workspace"},
	{Name: "memories", Target: "/memories"},
	{Name: "blocks", Target: "/blocks", ReadOnly: true},
	{Name: "skills", Target: "/skills"},
	{Name: "tasks", Target: "/tasks"},
}

// AreaSpec names a standard area and where it appears in the sandbox.
type AreaSpec struct {
	Name     string
	Target   string
	ReadOnly bool
}

// Bind is one host directory bound into the sandbox.
type Bind struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
	// Overlay, for a mount with mode overlay, names its layers; Source is
	// then the merged view, which the driver mounts before binding it.
	Overlay *overlay.Layers `json:"overlay,omitempty"`
	// GitDir marks the git directory of a session worktree (AddBinds):
	// claims add and remove these while the sandbox runs, so a driver
	// applies them live rather than asking for a restart.
	GitDir bool `json:"gitDir,omitempty"`
	// Anchor is the directory Source is resolved beneath on every act
	// (SourceDir): the SandboxClass root that allows it; "" for "/", or
	// for a source below the agent's directory, the areas root.
	Anchor string `json:"anchor,omitempty"`
	// NoLinks refuses every symbolic link between Anchor and Source: an
	// agent can reach that path (an area, or a source inside another of
	// the sandbox's read-write mounts).
	NoLinks bool `json:"noLinks,omitempty"`
}

// SourceDir is b's source as the held object every act resolves. A source
// below the agent's directory (an area, an overlay's merged view) is
// resolved beneath the areas root without following any link; the others
// as the bind says.
func (in Instance) SourceDir(b Bind) areas.HostDir {
	if b.Anchor == "" && in.AgentDir != "" && strings.HasPrefix(b.Source, in.AgentDir+"/") {
		return areas.HostDir{Anchor: filepath.Dir(in.AgentDir), Path: b.Source, NoLinks: true}
	}
	return areas.HostDir{Anchor: b.Anchor, Path: b.Source, NoLinks: b.NoLinks}
}

// WritableSource is a read-write area or mount and its source directory
// as the driver resolves it now.
type WritableSource struct {
	Bind Bind
	Dir  os.FileInfo
}

// WritableSources are in's read-write areas and mounts (an overlay's
// writes stay in its upper layer): what the sandbox can change on the
// host. A source that cannot be resolved is left out, the driver's to
// report.
func (in Instance) WritableSources() []WritableSource {
	var out []WritableSource
	for _, b := range slices.Concat(in.Areas, in.Mounts) {
		if b.ReadOnly || b.Overlay != nil {
			continue
		}
		d, err := in.SourceDir(b).Open()
		if err != nil {
			continue
		}
		if fi, err := d.Stat(); err == nil {
			out = append(out, WritableSource{Bind: b, Dir: fi})
		}
		d.Close()
	}
	return out
}

// Instance is everything a driver needs to converge one agent's sandbox.
type Instance struct {
	Name  string `json:"name"`
	Agent string `json:"agent"`
	// Owner is <namespace>/<name> of the Sandbox, recorded on the instance.
	Owner string `json:"owner"`
	// AgentDir is <areas-root>/<agent> on the host.
	AgentDir string `json:"agentDir"`
	// Areas are the standard areas, host source to sandbox target.
	Areas []Bind `json:"areas"`
	// Mounts are the custom mounts, targets already below /workspace/.
	Mounts   []Bind   `json:"mounts"`
	Binaries []string `json:"binaries"`
	Devices  Devices  `json:"devices"`
	Env      []string `json:"passthrough"`
	Image    string   `json:"image,omitempty"`
	// ImageContainer, for a bwrap instance with an Image (on a cluster),
	// is the node runtime's ID of the Sandbox's Pod's container (64
	// hexadecimal digits), whose root file system holds the image: the
	// instance's commands see its system directories. A new container is
	// a new ConfigHash.
	ImageContainer string `json:"imageContainer,omitempty"`
	// Containerd and Incus are the settings of those backends; nil for
	// the others.
	Containerd *ContainerdConfig `json:"containerd,omitempty"`
	Incus      *IncusConfig      `json:"incus,omitempty"`
	// Identity is the unprivileged host user and group the agent's commands
	// and files belong to; never 0.
	Identity Identity `json:"identity"`
	// StopOnExit asks the controller to stop the instance when it shuts
	// down (incus shutdownOnExit, default true).
	StopOnExit bool `json:"stopOnExit"`
	// Resources bound the instance's commands together; every driver
	// enforces them.
	Resources Resources `json:"resources"`
	// Network, when set, is the network namespace the instance's commands
	// run in, in place of one with nothing in it: a Sandbox's egress
	// namespace, whose only way out is its proxy. Nil: no network at all.
	Network *Network `json:"network,omitempty"`
	// Pod, on a cluster, is the Sandbox's Pod: the instance's processes
	// run in a cgroup below the Pod's, which the kubelet accounts (its
	// eviction, its summary API, `kubectl top pod`). Nil: below the
	// driver's own cgroup parent.
	Pod *Pod `json:"pod,omitempty"`
	// ConfigHash identifies everything above; a running instance whose hash
	// differs needs a restart to take the change.
	ConfigHash string `json:"-"`
}

// Pod is the Pod whose cgroup an instance runs in.
type Pod struct {
	// UID is the Pod's.
	UID string `json:"uid"`
	// Cgroup is the Pod's cgroup, a path from the root of each hierarchy,
	// as the node's kubelet made it.
	Cgroup string `json:"cgroup"`
	// CgroupRoot is where the node's cgroup hierarchies are mounted for
	// the controller (a hostPath in its pod); it is no part of the
	// ConfigHash.
	CgroupRoot string `json:"cgroupRoot"`
}

// Network is a network namespace prepared for an instance.
type Network struct {
	// Namespace is the path that holds the namespace (a bind mount of its
	// nsfs file).
	Namespace string `json:"namespace"`
	// Proxy is the URL of the proxy listening inside the namespace, which
	// commands are pointed at (HTTP_PROXY and the rest); empty: none.
	Proxy string `json:"proxy,omitempty"`
	// Allow and AllowedNets are the policy the proxy holds requests to;
	// the proxy reads them, the driver does not. They are not part of the
	// ConfigHash: the proxy takes a new list live.
	Allow       []EgressRule `json:"-"`
	AllowedNets []string     `json:"-"`
}

// ProxyURL is the URL of the instance's egress proxy; empty without one.
func (in Instance) ProxyURL() string {
	if in.Network == nil {
		return ""
	}
	return in.Network.Proxy
}

// EgressRule is one destination of an allowlist: a host (name, "*." and a
// domain, or an address) and its ports (none: 443 and 80).
type EgressRule struct {
	Host  string
	Ports []int
}

// Resources are an instance's requests and limits; zero means none.
type Resources struct {
	// CPUMillis is the CPU limit in thousandths of a core.
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	// MemoryBytes is the memory limit.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// Pids is the limit of processes and threads.
	Pids int64 `json:"pids,omitempty"`
	// CPURequestMillis and MemoryRequestBytes are what is expected: a
	// cgroup's CPU weight, a scheduler's reservation.
	CPURequestMillis   int64 `json:"cpuRequestMillis,omitempty"`
	MemoryRequestBytes int64 `json:"memoryRequestBytes,omitempty"`
}

// Any reports whether r limits anything.
func (r Resources) Any() bool { return r.CPUMillis > 0 || r.MemoryBytes > 0 || r.Pids > 0 }

// Devices are the host devices the sandbox sees.
type Devices struct {
	// USB: the host's USB device nodes.
	USB bool `json:"usb,omitempty"`
	// All: the host's /dev, far broader than USB.
	All bool `json:"all,omitempty"`
}

// ContainerdConfig is what the containerd driver takes beyond the fields
// every driver shares.
type ContainerdConfig struct {
	// MemoryLimit caps the container's memory; nil for no limit.
	MemoryLimit *Size `json:"memoryLimit,omitempty"`
	// PidsLimit caps the container's processes; zero for no limit.
	PidsLimit int64 `json:"pidsLimit,omitempty"`
	// RootfsSizeLimit is what the writable layer may hold before the
	// health check reports it; nil for no limit.
	RootfsSizeLimit *Size `json:"rootfsSizeLimit,omitempty"`
}

// IncusConfig is what the Incus driver takes beyond the fields every
// driver shares.
type IncusConfig struct {
	// Profiles are applied when the instance is created.
	Profiles []string `json:"profiles,omitempty"`
	// Project is the Incus project; empty for the client's current one.
	Project string `json:"project,omitempty"`
	// ShutdownOnExit is the Sandbox's setting as written (nil when unset).
	// No driver reads it, the controller reads Instance.StopOnExit; the
	// ConfigHash (version 1) does, where it tells unset from true.
	ShutdownOnExit *bool `json:"shutdownOnExit,omitempty"`
	// RootSizeLimit is what the root volume may hold before the health
	// check reports it; nil for no limit.
	RootSizeLimit *Size `json:"rootSizeLimit,omitempty"`
}

// Size is a number of bytes together with the quantity it was written as
// ("512Mi", in its canonical form). An Instance encodes the quantity, so
// its encoding, and with it the ConfigHash and the descriptions drivers
// recorded, is what it was when the Instance held the API's quantities.
type Size struct {
	Bytes int64
	Text  string
}

// SizeOf is the Size of a quantity in its canonical form.
func SizeOf(quantity string) (*Size, error) {
	q, err := resource.ParseQuantity(quantity)
	if err != nil {
		return nil, fmt.Errorf("size %q: %w", quantity, err)
	}
	return &Size{Bytes: q.Value(), Text: q.String()}, nil
}

// BytesOf is the number of bytes of s, zero for nil (no limit).
func (s *Size) BytesOf() int64 {
	if s == nil {
		return 0
	}
	return s.Bytes
}

func (s Size) MarshalJSON() ([]byte, error) { return json.Marshal(s.Text) }

func (s *Size) UnmarshalJSON(b []byte) error {
	var text string
	if err := json.Unmarshal(b, &text); err != nil {
		return fmt.Errorf("a size is a quantity string: %w", err)
	}
	v, err := SizeOf(text)
	if err != nil {
		return err
	}
	*s = *v
	return nil
}

// Identity is a host user and group id pair.
type Identity struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Areas is id as the identity file access acts as.
func (id Identity) Areas() areas.Identity { return areas.Identity{UID: id.UID, GID: id.GID} }

// AddBinds adds binds at absolute targets outside /workspace (the git
// directories of session worktrees, mounted where their worktrees' .git
// files point), marked GitDir, and updates the ConfigHash.
func (in *Instance) AddBinds(binds ...Bind) {
	for _, b := range binds {
		b.GitDir = true
		in.Mounts = append(in.Mounts, b)
	}
	sort.Slice(in.Mounts, func(i, j int) bool { return in.Mounts[i].Target < in.Mounts[j].Target })
	in.ConfigHash = in.Hash()
}

// Workspace is the area mounted at /workspace, false when in has none.
func (in Instance) Workspace() (Bind, bool) {
	for _, a := range in.Areas {
		if a.Target == StandardAreas[0].Target {
			return a, true
		}
	}
	return Bind{}, false
}

// DotEnv reads workspace/.env as the agent (policy.ReadDotEnv); nil when
// in has no workspace or the file is missing.
func (in Instance) DotEnv() ([]byte, error) {
	ws, ok := in.Workspace()
	if !ok {
		return nil, nil
	}
	return policy.ReadDotEnv(in.SourceDir(ws), in.Identity.Areas())
}

// LayoutAreas creates the agent's directory and its standard areas when
// missing; it never removes or replaces anything.
func (in Instance) LayoutAreas() error {
	names := make([]string, 0, len(in.Areas))
	for _, a := range in.Areas {
		names = append(names, filepath.Base(a.Source))
	}
	return areas.Layout(in.AgentDir, names, in.Identity.UID)
}

// FileView opens the contained view of the areas and custom mounts, as the
// sandbox sees them, for the controller's own file access: every access
// acts as the agent's identity. It creates nothing: the areas are laid out
// before (instance.Prepare, a driver's Ensure).
func (in Instance) FileView() (*areas.View, error) {
	binds := make([]areas.Binding, 0, len(in.Areas)+len(in.Mounts))
	for _, b := range append(slices.Clone(in.Areas), in.Mounts...) {
		binds = append(binds, areas.Binding{Target: b.Target, Dir: in.SourceDir(b), ReadOnly: b.ReadOnly})
	}
	return areas.OpenView(binds, in.Identity.Areas())
}
