// Package sandboxclass decides whether a SandboxClass allows a Sandbox's
// spec, on the node, before anything of the Sandbox starts: the controller
// asks it on every reconcile, so a Sandbox admitted without the admission
// policy, or under a class that changed since, is still held to its class.
//
// Mount sources are checked as every later act resolves them: ~/
// expanded, then opened beneath the allowed root that holds them with
// openat2 (areas.HostDir: links only while they stay beneath the root, no
// magic links, not /proc or /sys). The instance description anchors each
// source at that root (instance.Host.MountRoots), so every bind and file
// access resolves the same object again, beneath the same root, and a
// component an agent swaps between two acts cannot lead out of it.
//
// This package never writes a Sandbox and never creates anything on the
// host; it only reads.
package sandboxclass

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
)

// Select picks the class of spec among classes, the cluster's
// SandboxClasses. It returns nil and "" when no class applies (there are
// no classes), and a message naming spec.className and the rule when the
// Sandbox cannot be given one.
func Select(classes []v1alpha1.SandboxClass, spec *v1alpha1.SandboxSpec) (*v1alpha1.SandboxClass, string) {
	if len(classes) == 0 {
		if spec.ClassName != "" {
			return nil, fmt.Sprintf("spec.className: SandboxClass %q does not exist", spec.ClassName)
		}
		return nil, ""
	}
	if spec.ClassName != "" {
		for i := range classes {
			if classes[i].Name == spec.ClassName {
				return &classes[i], ""
			}
		}
		return nil, fmt.Sprintf("spec.className: SandboxClass %q does not exist", spec.ClassName)
	}
	var defaults []string
	var class *v1alpha1.SandboxClass
	for i := range classes {
		if IsDefault(&classes[i]) {
			defaults = append(defaults, classes[i].Name)
			class = &classes[i]
		}
	}
	switch len(defaults) {
	case 0:
		return nil, fmt.Sprintf("spec.className: the cluster has SandboxClasses but none is marked default (label %s=true), so a Sandbox must name one", v1alpha1.DefaultClassLabel)
	case 1:
		return class, ""
	default:
		sort.Strings(defaults)
		return nil, fmt.Sprintf("spec.className: %d SandboxClasses are marked default (%s): name one in spec.className, or an administrator keeps the label %s=true on one only",
			len(defaults), strings.Join(defaults, ", "), v1alpha1.DefaultClassLabel)
	}
}

// IsDefault reports whether c is marked as the default class.
func IsDefault(c *v1alpha1.SandboxClass) bool {
	return c.Labels[v1alpha1.DefaultClassLabel] == "true"
}

// Node is what the checks need to know of the node.
type Node struct {
	// Home expands mount sources that begin with ~/.
	Home string
}

// Effective checks spec against class and returns the spec the instance
// is built from: mount sources with ~/ expanded and links resolved, and the
// class's limits where the Sandbox sets none. The second result lists every
// rule the spec breaks, each naming the field and the rule; when it is not
// empty, the returned spec must not be used. spec is not changed.
func Effective(class *v1alpha1.SandboxClass, spec *v1alpha1.SandboxSpec, node Node) (*v1alpha1.SandboxSpec, []string) {
	out := spec.DeepCopy()
	cs := &class.Spec
	name := class.Name
	var v []string

	if b := spec.BackendOrDefault(); !slices.Contains(cs.AllowedBackends, b) {
		v = append(v, fmt.Sprintf("spec.backend: SandboxClass %q allows the backends [%s], not %q", name, joinBackends(cs.AllowedBackends), b))
	}

	if cs.MaxMounts != nil && len(spec.Mounts) > int(*cs.MaxMounts) {
		v = append(v, fmt.Sprintf("spec.mounts: SandboxClass %q allows at most %d mounts, the Sandbox has %d", name, *cs.MaxMounts, len(spec.Mounts)))
	}
	roots := MountRoots(class)
	for i, m := range spec.Mounts {
		field := fmt.Sprintf("spec.mounts[%d].source", i)
		src := m.Source
		if strings.HasPrefix(src, "~/") {
			if node.Home == "" {
				v = append(v, fmt.Sprintf("%s: %q begins with ~/ but the controller has no home directory to expand it", field, src))
				continue
			}
			src = filepath.Join(node.Home, src[2:])
		}
		src = filepath.Clean(src)
		if msg := checkSource(src, roots); msg != "" {
			v = append(v, fmt.Sprintf("%s: %q %s SandboxClass %q allows [%s]", field, m.Source, msg, name, strings.Join(cs.AllowedMountSourceRoots, ", ")))
			continue
		}
		out.Mounts[i].Source = src
	}

	for i, e := range spec.Env.Passthrough {
		if !envAllowed(string(e), cs.AllowedEnv) {
			v = append(v, fmt.Sprintf("spec.env.passthrough[%d]: SandboxClass %q does not allow passing the controller's variable %q into commands (allowedEnv: [%s])", i, name, e, strings.Join(cs.AllowedEnv, ", ")))
		}
	}

	if spec.Devices.USB && !cs.Devices.USB {
		v = append(v, fmt.Sprintf("spec.devices.usb: SandboxClass %q does not allow the host's USB devices", name))
	}
	if spec.Devices.All && !cs.Devices.All {
		v = append(v, fmt.Sprintf("spec.devices.all: SandboxClass %q does not allow the host /dev", name))
	}

	if spec.EgressOrDefault() == v1alpha1.EgressAllowlist {
		for i, r := range spec.Network.Allow {
			if !slices.ContainsFunc(cs.AllowedEgress, func(a string) bool { return egress.Covers(a, r.Host) }) {
				v = append(v, fmt.Sprintf("spec.network.allow[%d].host: SandboxClass %q does not allow egress to %q (allowedEgress: [%s])", i, name, r.Host, strings.Join(cs.AllowedEgress, ", ")))
			}
		}
	}

	// The backend's own settings (an image, a disk size) follow its rules.
	if b, ok := backend.Lookup(spec.BackendOrDefault()); ok && b.Class != nil {
		v = append(v, b.Class(class, spec, out)...)
	}
	v = append(v, applyResources(class, spec, out)...)
	v = append(v, Scheduling(class, spec)...)
	if len(v) > 0 {
		return nil, v
	}
	return out, nil
}

// Scheduling checks the fields of spec that its Pod carries past its own
// placement (a priority, tolerations, affinity to other Pods, a pinned
// node) against class. Each violation names the field and the rule. The
// placer asks it before it makes a Sandbox's Pod, which no node's check
// precedes; Effective asks it too.
func Scheduling(class *v1alpha1.SandboxClass, spec *v1alpha1.SandboxSpec) []string {
	cs := &class.Spec.Scheduling
	var v []string
	if p := spec.PriorityClassName; p != "" && !slices.Contains(cs.AllowedPriorityClassNames, "*") && !slices.Contains(cs.AllowedPriorityClassNames, p) {
		v = append(v, fmt.Sprintf("spec.priorityClassName: SandboxClass %q does not allow the PriorityClass %q (scheduling.allowedPriorityClassNames: [%s])",
			class.Name, p, strings.Join(cs.AllowedPriorityClassNames, ", ")))
	}
	for i, t := range spec.Tolerations {
		if slices.Contains(cs.AllowedTolerations, "*") || t.Key != "" && slices.Contains(cs.AllowedTolerations, t.Key) {
			continue
		}
		what := fmt.Sprintf("the taint key %q", t.Key)
		if t.Key == "" {
			what = "every taint"
		}
		v = append(v, fmt.Sprintf("spec.tolerations[%d]: SandboxClass %q does not allow tolerating %s (scheduling.allowedTolerations: [%s])",
			i, class.Name, what, strings.Join(cs.AllowedTolerations, ", ")))
	}
	if a := spec.Affinity; a != nil && !cs.PodAffinity && (a.PodAffinity != nil || a.PodAntiAffinity != nil) {
		field := "spec.affinity.podAffinity"
		if a.PodAffinity == nil {
			field = "spec.affinity.podAntiAffinity"
		}
		v = append(v, fmt.Sprintf("%s: SandboxClass %q does not allow affinity or anti-affinity to other Pods (scheduling.podAffinity)", field, class.Name))
	}
	if spec.NodeName != "" && !cs.NodeName {
		v = append(v, fmt.Sprintf("spec.nodeName: SandboxClass %q does not allow pinning a Sandbox to a node (scheduling.nodeName)", class.Name))
	}
	return v
}

// applyResources checks spec's resources (the deprecated containerd
// limits included) against the class's maximums, on every backend, and
// sets out.Resources to them with the class's defaults (else maximums)
// where spec sets none.
func applyResources(class *v1alpha1.SandboxClass, spec, out *v1alpha1.SandboxSpec) []string {
	cs := &class.Spec
	r := spec.ResourcesOrDeprecated()
	def, max := classResources(cs.DefaultResources, cs.DefaultLimits), classResources(cs.MaxResources, cs.MaxLimits)
	memField, pidsField := "spec.resources.limits.memory", "spec.resources.pidsLimit"
	if spec.Resources == nil || spec.Resources.Limits.Memory == nil {
		if spec.Containerd != nil && spec.Containerd.MemoryLimit != nil {
			memField = "spec.containerd.memoryLimit"
		}
	}
	if spec.Resources == nil || spec.Resources.PidsLimit == nil {
		if spec.Containerd != nil && spec.Containerd.PidsLimit != nil {
			pidsField = "spec.containerd.pidsLimit"
		}
	}
	var v []string
	// given says which amounts the class gave, and as what.
	given := map[string]string{}
	for _, q := range []struct {
		field, class string
		val          **resource.Quantity
		def, max     *resource.Quantity
	}{
		{"spec.resources.requests.cpu", "requests.cpu", &r.Requests.CPU, def.Requests.CPU, max.Requests.CPU},
		{"spec.resources.requests.memory", "requests.memory", &r.Requests.Memory, def.Requests.Memory, max.Requests.Memory},
		{"spec.resources.limits.cpu", "limits.cpu", &r.Limits.CPU, def.Limits.CPU, max.Limits.CPU},
		{memField, "limits.memory", &r.Limits.Memory, def.Limits.Memory, max.Limits.Memory},
	} {
		switch {
		case *q.val != nil && q.max != nil && (*q.val).Cmp(*q.max) > 0:
			v = append(v, fmt.Sprintf("%s: %s is above the maximum %s of SandboxClass %q", q.field, (*q.val).String(), q.max.String(), class.Name))
		case *q.val == nil && q.def != nil:
			c := q.def.DeepCopy()
			*q.val = &c
			given[q.field] = fmt.Sprintf("the default of SandboxClass %q (defaultResources.%s)", class.Name, q.class)
		case *q.val == nil && q.max != nil:
			c := q.max.DeepCopy()
			*q.val = &c
			given[q.field] = fmt.Sprintf("the maximum of SandboxClass %q (maxResources.%s, which applies when it gives no default)", class.Name, q.class)
		}
	}
	// A request above its limit, where the class gave one of the two: the
	// spec alone is held to that by its own validation. The runtimes would
	// take the request as it is (a CPU weight above what the limit lets it
	// use), and a cluster refuses such a Pod.
	for _, a := range []struct {
		req, lim           *resource.Quantity
		reqField, limField string
	}{
		{r.Requests.CPU, r.Limits.CPU, "spec.resources.requests.cpu", "spec.resources.limits.cpu"},
		{r.Requests.Memory, r.Limits.Memory, "spec.resources.requests.memory", memField},
	} {
		if a.req == nil || a.lim == nil || a.req.Cmp(*a.lim) <= 0 {
			continue
		}
		switch {
		case given[a.limField] != "" && given[a.reqField] == "":
			v = append(v, fmt.Sprintf("%s: %s is above the limit %s, %s; set %s too", a.reqField, a.req.String(), a.lim.String(), given[a.limField], a.limField))
		case given[a.reqField] != "" && given[a.limField] == "":
			v = append(v, fmt.Sprintf("%s: %s is below the request %s, %s; set %s too", a.limField, a.lim.String(), a.req.String(), given[a.reqField], a.reqField))
		case given[a.reqField] != "":
			v = append(v, fmt.Sprintf("%s: the request %s, %s, is above the limit %s, %s", a.reqField, a.req.String(), given[a.reqField], a.lim.String(), given[a.limField]))
		}
	}
	switch {
	case r.PidsLimit != nil && max.PidsLimit != nil && *r.PidsLimit > *max.PidsLimit:
		v = append(v, fmt.Sprintf("%s: %d is above the maximum %d of SandboxClass %q", pidsField, *r.PidsLimit, *max.PidsLimit, class.Name))
	case r.PidsLimit == nil && def.PidsLimit != nil:
		p := *def.PidsLimit
		r.PidsLimit = &p
	case r.PidsLimit == nil && max.PidsLimit != nil:
		p := *max.PidsLimit
		r.PidsLimit = &p
	}
	out.Resources = &r
	return v
}

// classResources is a class's resources, with the deprecated memory and
// pids limits of its ClassLimits where it gives none.
func classResources(r *v1alpha1.Resources, old *v1alpha1.ClassLimits) v1alpha1.Resources {
	var out v1alpha1.Resources
	if r != nil {
		out = *r.DeepCopy()
	}
	if old != nil {
		if out.Limits.Memory == nil && old.MemoryLimit != nil {
			m := old.MemoryLimit.DeepCopy()
			out.Limits.Memory = &m
		}
		if out.PidsLimit == nil && old.PidsLimit != nil {
			p := *old.PidsLimit
			out.PidsLimit = &p
		}
	}
	return out
}

// AgentIDs is the block of host ids the agents of class may have: the
// class's agentIDs, which must lie inside the controller's range. Without
// agentIDs it is the controller's range.
func AgentIDs(class *v1alpha1.SandboxClass, controller areas.IDRange) (areas.IDRange, string) {
	if class == nil || class.Spec.AgentIDs == "" {
		return controller, ""
	}
	r, err := areas.ParseIDRange(class.Spec.AgentIDs)
	if err != nil {
		return areas.IDRange{}, fmt.Sprintf("spec.className: SandboxClass %q has agentIDs the controller cannot use: %v", class.Name, err)
	}
	last := uint64(r.First) + uint64(r.Count) - 1
	if !controller.Contains(r.First) || !controller.Contains(uint32(last)) {
		return areas.IDRange{}, fmt.Sprintf("spec.className: SandboxClass %q gives agents the host ids %s, which this controller does not hand out (--agent-ids %s)", class.Name, r, controller)
	}
	return r, ""
}

// CheckAgentID says why an agent whose host id is id may not belong to
// class (its ids are ids), or "" when it may.
func CheckAgentID(class *v1alpha1.SandboxClass, ids areas.IDRange, agent string, id uint32) string {
	if ids.Contains(id) {
		return ""
	}
	return fmt.Sprintf("spec.agent: agent %q runs as host id %d, outside the ids %s that SandboxClass %q allows: choose another agent name, or an administrator moves the agent's areas",
		agent, id, ids, class.Name)
}

// MountRoots are the directories class allows mount sources below, each
// as written and, where the node resolves it elsewhere, as resolved: a
// source written either way is anchored at it (instance.Host.MountRoots).
func MountRoots(class *v1alpha1.SandboxClass) []string {
	var out []string
	for _, r := range class.Spec.AllowedMountSourceRoots {
		r = filepath.Clean(r)
		out = append(out, r)
		if real, err := areas.RealPath(r); err == nil && real != r {
			out = append(out, real)
		}
	}
	return out
}

// checkSource says why src may not be a mount source below roots, or ""
// when it may. The verdict is about the object every later act resolves:
// src is opened beneath the root that holds it, as each bind and file
// access will open it again (areas.HostDir), so a link that leads out of
// the root, a /proc magic link or /proc itself is refused here and there.
// A source that does not exist yet passes: every act resolves it beneath
// the same root once it does.
func checkSource(src string, roots []string) string {
	d, ok := areas.AnchorFor(src, roots)
	if !ok || len(roots) == 0 {
		return "lies outside the mount source roots"
	}
	f, err := d.Open()
	switch {
	case err == nil:
		f.Close()
		return ""
	case errors.Is(err, fs.ErrNotExist):
		return ""
	case errors.Is(err, areas.ErrEscape):
		return "leads, through a symbolic link, outside the mount source roots"
	case errors.Is(err, areas.ErrPseudoFS):
		return "is on /proc or /sys, which no mount may use; it is not accepted as within the mount source roots"
	default:
		return fmt.Sprintf("cannot be resolved on the node (%v) to check it against the mount source roots", errors.Unwrap(err))
	}
}

// envAllowed reports whether allowed (names, or prefixes ending in '*')
// holds name.
func envAllowed(name string, allowed []string) bool {
	for _, a := range allowed {
		if p, ok := strings.CutSuffix(a, "*"); ok && strings.HasPrefix(name, p) || a == name {
			return true
		}
	}
	return false
}

func joinBackends(backends []v1alpha1.Backend) string {
	s := make([]string, len(backends))
	for i, b := range backends {
		s[i] = string(b)
	}
	return strings.Join(s, ", ")
}
