package runtimes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
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
	Mounts     []Bind                   `json:"mounts"`
	Binaries   []string                 `json:"binaries"`
	Devices    v1alpha1.Devices         `json:"devices"`
	Env        []string                 `json:"passthrough"`
	Image      string                   `json:"image,omitempty"`
	Containerd *v1alpha1.ContainerdSpec `json:"containerd,omitempty"`
	Incus      *v1alpha1.IncusSpec      `json:"incus,omitempty"`
	// Identity is the unprivileged host user and group the agent's commands
	// and files belong to; never 0 (see Options.Identity).
	Identity Identity `json:"identity"`
	// StopOnExit asks the controller to stop the instance when it shuts
	// down (incus shutdownOnExit, default true).
	StopOnExit bool `json:"stopOnExit"`
	// ConfigHash identifies everything above; a running instance whose hash
	// differs needs a restart to take the change.
	ConfigHash string `json:"-"`
}

// Identity is a host user and group id pair.
type Identity struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Options are the host facts Describe needs.
type Options struct {
	// AreasRoot holds one directory per agent.
	AreasRoot string
	// Home expands mount sources that begin with ~/.
	Home string
	// Identities hands each agent its host id. Nil means: the caller's own
	// id when it is not root, else ids of areas.DefaultIDRange allocated
	// in AreasRoot.
	Identities *areas.Identities
}

// identityFor is the host identity of agent under opts.
func identityFor(agent string, opts Options) (Identity, error) {
	ids := opts.Identities
	if ids == nil {
		if uid := os.Geteuid(); uid != 0 {
			return Identity{UID: uint32(uid), GID: uint32(os.Getegid())}, nil
		}
		var err error
		if ids, err = defaultIdentities(opts.AreasRoot); err != nil {
			return Identity{}, err
		}
	}
	id, err := ids.For(agent)
	if err != nil {
		return Identity{}, fmt.Errorf("giving agent %s a host identity: %w", agent, err)
	}
	return Identity{UID: id, GID: id}, nil
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

// Describe builds the Instance for a Sandbox spec. It applies the admission
// rules again and refuses a spec that breaks one.
func Describe(owner string, spec *v1alpha1.SandboxSpec, opts Options) (Instance, error) {
	if errs := v1alpha1.ValidateSandboxSpec(spec); len(errs) > 0 {
		return Instance{}, fmt.Errorf("sandbox %s: %w", owner, errs.ToAggregate())
	}
	if !filepath.IsAbs(opts.AreasRoot) {
		return Instance{}, fmt.Errorf("areas root %q must be an absolute path", opts.AreasRoot)
	}
	agentDir := filepath.Join(opts.AreasRoot, spec.Agent)
	id, err := identityFor(spec.Agent, opts)
	if err != nil {
		return Instance{}, err
	}
	in := Instance{
		Identity: id,
		Name:     v1alpha1.InstanceName(spec.Agent),
		Agent:    spec.Agent,
		Owner:    owner,
		AgentDir: agentDir,
		Devices:  spec.Devices,
	}
	for _, a := range StandardAreas {
		in.Areas = append(in.Areas, Bind{Source: filepath.Join(agentDir, a.Name), Target: a.Target, ReadOnly: a.ReadOnly})
	}
	for _, m := range spec.Mounts {
		src := m.Source
		if strings.HasPrefix(src, "~/") {
			if opts.Home == "" {
				return Instance{}, fmt.Errorf("mount %q: source begins with ~/ but the controller has no home directory", m.Target)
			}
			src = filepath.Join(opts.Home, src[2:])
		}
		b := Bind{
			Source:   filepath.Clean(src),
			Target:   "/workspace/" + m.Target,
			ReadOnly: m.Mode != v1alpha1.MountReadWrite && m.Mode != v1alpha1.MountOverlay,
		}
		if m.Mode == v1alpha1.MountOverlay {
			l := overlay.For(agentDir, b.Source, m.Target)
			l.Owner = id.UID
			if m.SizeLimit != nil {
				l.SizeLimit = m.SizeLimit.Value()
			}
			b.Source, b.Overlay = l.Merged, &l
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
	switch spec.BackendOrDefault() {
	case v1alpha1.BackendContainerd:
		in.Image = spec.Containerd.Image
		in.Containerd = spec.Containerd.DeepCopy()
	case v1alpha1.BackendIncus:
		in.Image = spec.Incus.Image
		in.Incus = spec.Incus.DeepCopy()
		in.StopOnExit = spec.Incus.ShutdownOnExit == nil || *spec.Incus.ShutdownOnExit
	}
	in.ConfigHash = hashOf(in)
	return in, nil
}

func hashOf(in Instance) string {
	// Owner is not part of the configuration: adopting an instance under the
	// same owner must not look like a change.
	in.Owner = ""
	b, err := json.Marshal(in)
	if err != nil {
		panic(fmt.Sprintf("marshalling an instance description: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// AddBinds adds binds at absolute targets outside /workspace (the git
// directories of session worktrees, mounted where their worktrees' .git
// files point), marked GitDir, and updates the ConfigHash.
func (in *Instance) AddBinds(binds ...Bind) {
	for _, b := range binds {
		b.GitDir = true
		in.Mounts = append(in.Mounts, b)
	}
	sort.Slice(in.Mounts, func(i, j int) bool { return in.Mounts[i].Target < in.Mounts[j].Target })
	in.ConfigHash = hashOf(*in)
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

// FileView lays out the areas and opens the contained view of the areas and
// custom mounts, as the sandbox sees them, for the controller's own file
// access.
func (in Instance) FileView() (*areas.View, error) {
	if err := in.LayoutAreas(); err != nil {
		return nil, err
	}
	binds := make([]areas.Binding, 0, len(in.Areas)+len(in.Mounts))
	for _, b := range append(slices.Clone(in.Areas), in.Mounts...) {
		binds = append(binds, areas.Binding{Target: b.Target, Source: b.Source, ReadOnly: b.ReadOnly})
	}
	return areas.OpenView(binds)
}
