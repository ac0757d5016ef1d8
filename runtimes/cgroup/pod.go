//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/pattern"
)

// A Sandbox on a cluster has a Pod, and the kubelet accounts for what runs
// in that Pod's cgroup: its eviction, its summary API and `kubectl top`
// see it. Pods finds a Pod's cgroup on the node by the Pod's UID, in the
// node's cgroup hierarchies (mounted at Root: in the controller's pod, a
// hostPath of the node's /sys/fs/cgroup); At gives a Manager that makes
// the instance's cgroup right below it. The cgroup is the kubelet's: it is
// never made or removed here (on cgroup v2 the controllers its children
// need are given to them, as the kubelet gives them to its containers).

// ErrPodNotFound is wrapped when no cgroup of the Pod is on this node (yet:
// the kubelet makes it when it starts the Pod).
var ErrPodNotFound = errors.New("the Pod's cgroup is not on this node")

// uidPattern is a Pod UID as the API server makes it; nothing else is
// looked for, so a UID never becomes more than a file name.
var uidPattern = pattern.Lazy(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// podSearchDepth bounds the search: the kubelet's pod cgroups sit at
// <cgroup-root>/kubepods[/<qos>]/pod<uid> (cgroupfs driver) or
// kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice
// (systemd driver), a few levels down.
const podSearchDepth = 5

// Pods finds Pods' cgroups below Root and keeps what it found.
type Pods struct {
	// Root is where the node's cgroup file systems are mounted.
	Root string

	mu sync.Mutex
	v2 *bool
	// owner is the user the kubelet's cgroups belong to: root (a test's
	// tree is its user's).
	owner uint32
	found map[string]string
}

// NewPods finds Pods' cgroups in the hierarchies mounted at root.
func NewPods(root string) *Pods {
	return &Pods{Root: root, found: map[string]string{}}
}

// isV2 says whether Root is the unified hierarchy.
func (p *Pods) isV2() (bool, error) {
	if p.v2 != nil {
		return *p.v2, nil
	}
	v2, err := isV2(p.Root)
	if err != nil {
		return false, err
	}
	p.v2 = &v2
	return v2, nil
}

func isV2(root string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return false, fmt.Errorf("%w: %s: %w", ErrUnavailable, root, err)
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC, nil
}

// Find returns the cgroup an instance of the Pod with uid runs below, as a
// path from the root of each hierarchy: on cgroup v1, that of its
// container (containerID, as the Pod's status gives it: the kubelet
// reports a Pod's containers, and evicts by them; the container's
// cgroup counts its children's use); on v2, where a cgroup with a process
// of its own (the container's) can give no controller to a child, the
// Pod's (the kubelet's summary counts it for the Pod).
func (p *Pods) Find(uid, containerID string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v2, err := p.isV2()
	if err != nil {
		return "", err
	}
	pod, err := p.pod(uid, v2)
	if err != nil || v2 {
		return pod, err
	}
	return p.container(pod, containerID)
}

// containerIDPattern is a container ID as the kubelet reports it.
var containerIDPattern = pattern.Lazy(`^[a-z0-9.-]+://([0-9a-f]{64})$`)

// container returns the cgroup of the container with id below the Pod's
// cgroup pod (v1): <id> under the kubelet's cgroupfs driver, a scope named
// after the runtime and the id under its systemd driver.
func (p *Pods) container(pod, containerID string) (string, error) {
	m := containerIDPattern().FindStringSubmatch(containerID)
	if m == nil {
		return "", fmt.Errorf("%w: the Pod's container has no ID yet (%q)", ErrPodNotFound, containerID)
	}
	id := m[1]
	for _, name := range []string{id, "cri-containerd-" + id + ".scope", "crio-" + id + ".scope", "docker-" + id + ".scope"} {
		path := pod + "/" + name
		if p.inEveryHierarchy(path) {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w: no cgroup of container %s below %s", ErrPodNotFound, id, pod)
}

// inEveryHierarchy says whether path is a cgroup of every v1 hierarchy
// instances use.
func (p *Pods) inEveryHierarchy(path string) bool {
	for _, c := range v1Controllers {
		if st, err := os.Lstat(filepath.Join(p.Root, c, path)); err != nil || !st.IsDir() {
			return false
		}
	}
	return true
}

// pod returns the cgroup of the Pod with uid, as a path from the root of
// each hierarchy. On v1 the memory hierarchy is searched, and the path must
// be in the others too, as the kubelet makes it in each. p.mu is held.
func (p *Pods) pod(uid string, v2 bool) (string, error) {
	if !uidPattern().MatchString(uid) {
		return "", fmt.Errorf("%q is not a Pod UID", uid)
	}
	base := p.Root
	if !v2 {
		base = filepath.Join(p.Root, "memory")
	}
	if path, ok := p.found[uid]; ok {
		if st, err := os.Lstat(filepath.Join(base, path)); err == nil && st.IsDir() {
			return path, nil
		}
		delete(p.found, uid)
	}
	path, err := findPod(base, uid, p.owner)
	if err != nil {
		return "", err
	}
	if !v2 && !p.inEveryHierarchy(path) {
		return "", fmt.Errorf("%w: Pod %s has the memory cgroup %s, but not in each of %v", ErrPodNotFound, uid, path, v1Controllers)
	}
	p.found[uid] = path
	return path, nil
}

// At is the manager of the instance cgroups right below parent, an
// existing cgroup (a path from the root of each hierarchy, mounted at
// root) that is not ours: a Pod's, which the kubelet made. Unlike New's,
// its parent is never made, and never removed with the last instance.
func At(root, parent string) (*Manager, error) {
	v2, err := isV2(root)
	if err != nil {
		return nil, err
	}
	m := &Manager{V2: v2, dirs: map[string]string{}, kubelets: true}
	if v2 {
		m.dirs[""] = filepath.Join(root, parent)
	} else {
		for _, c := range v1Controllers {
			m.dirs[c] = filepath.Join(root, c, parent)
		}
	}
	if !m.parentExists() {
		return nil, fmt.Errorf("%w: %s is not in every hierarchy below %s", ErrPodNotFound, parent, root)
	}
	m.swap = swapAccounted(v2, m.Dir("memory", ""))
	m.tcp = tcpLimited(v2, m.Dir("memory", ""))
	return m, nil
}

// isPodDir says whether a cgroup named name is the Pod with uid's, under
// either of the kubelet's cgroup drivers.
func isPodDir(name, uid string) bool {
	return name == "pod"+uid || (strings.HasPrefix(name, "kubepods") &&
		strings.HasSuffix(name, "-pod"+strings.ReplaceAll(uid, "-", "_")+".slice"))
}

// findPod searches base for the Pod's cgroup where the kubelet makes Pods'
// cgroups, and nowhere else: below a cgroup named kubepods* (and its QoS
// classes, burstable and besteffort), at the top of the hierarchy or below
// one top-level cgroup (the kubelet's --cgroup-root). Names anywhere else
// are not the kubelet's to give (a container's cgroup is named after its
// instance, and an agent chooses that name), so a match there is never
// taken. Nor is one in a cgroup given to someone else: the search enters
// and takes only cgroups of owner (root; the kubelet's are), and never an
// Incus container's (lxc.payload.*, lxc.monitor.*), whose root may make
// kubepods/pod<uid> in the cgroup delegated to it. Two matches are an
// error, not a choice: one is not the kubelet's. It follows no link
// (cgroup file systems have none; a bind-mounted base might).
func findPod(base, uid string, owner uint32) (string, error) {
	type dir struct {
		path     string
		kubepods bool
	}
	level := []dir{{path: "."}}
	var found []string
	for depth := 0; depth < podSearchDepth && len(level) > 0; depth++ {
		var next []dir
		for _, d := range level {
			entries, err := os.ReadDir(filepath.Join(base, d.path))
			if err != nil {
				if depth == 0 {
					return "", fmt.Errorf("%w: reading %s: %w", ErrUnavailable, base, err)
				}
				continue // gone meanwhile
			}
			for _, e := range entries {
				if e.Type()&os.ModeType != os.ModeDir {
					continue
				}
				name := e.Name()
				pod := d.kubepods && isPodDir(name, uid)
				kubepods := d.kubepods && (name == "burstable" || name == "besteffort") ||
					strings.HasPrefix(name, "kubepods") && !strings.Contains(name, "-pod")
				cgroupRoot := depth == 0 && !d.kubepods
				sub := dir{path: filepath.Join(d.path, name), kubepods: d.kubepods || kubepods}
				switch {
				case !pod && !kubepods && !cgroupRoot:
					// Not where the kubelet makes Pods' cgroups.
				case delegated(filepath.Join(base, sub.path), name, owner):
					// Someone else's, who may make any name in it.
				case pod:
					found = append(found, "/"+sub.path)
				default:
					next = append(next, sub)
				}
			}
		}
		level = next
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%w: no cgroup pod%s below %s (the kubelet makes it when it starts the Pod)", ErrPodNotFound, uid, base)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("the Pod %s has %d cgroups below %s (%s): at most one is the kubelet's, and none is taken", uid, len(found), base, strings.Join(found, ", "))
}

// delegated says whether the cgroup at path, named name, is someone
// else's than owner's: an Incus container's or its monitor's (LXC's names
// for them), or one another user may make cgroups in (a cgroup delegated
// to an unprivileged container is its root's).
func delegated(path, name string, owner uint32) bool {
	if strings.HasPrefix(name, "lxc.payload.") || strings.HasPrefix(name, "lxc.monitor.") {
		return true
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return true // gone meanwhile
	}
	return st.Uid != owner
}

// parentExists says whether the parent is there in every hierarchy.
func (m *Manager) parentExists() bool {
	for _, d := range m.dirs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return false
		}
	}
	return true
}
