package sandboxclass

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Resolved is what a Sandbox is described from (instance.FromSandbox) under
// its class.
type Resolved struct {
	// Class is the Sandbox's class; nil when no class applies.
	Class *v1alpha1.SandboxClass
	// Spec is the Sandbox's spec with its class applied (Effective).
	Spec *v1alpha1.SandboxSpec
	// Host hands the agent an id of its class's block.
	Host instance.Host
}

// Resolve finds the class of spec among the cluster's SandboxClasses and
// checks spec against it on this node (host). Violations, when not empty,
// each name a field and the class's rule, and Resolved must not be used:
// nothing of the Sandbox may start and no area may be created for it.
// Resolve itself creates nothing: an agent's id is only read here.
func Resolve(ctx context.Context, c client.Reader, spec *v1alpha1.SandboxSpec, host instance.Host) (Resolved, []string, error) {
	var list v1alpha1.SandboxClassList
	if err := c.List(ctx, &list); err != nil {
		return Resolved{}, nil, fmt.Errorf("listing SandboxClasses for the Sandbox of agent %s: %w", spec.Agent, err)
	}
	class, msg := Select(list.Items, spec)
	if msg != "" {
		return Resolved{}, []string{msg}, nil
	}
	if class == nil {
		return Resolved{Spec: spec, Host: host}, nil, nil
	}
	out, v := Effective(class, spec, Node{Home: host.Home})
	if len(v) > 0 {
		return Resolved{}, v, nil
	}
	// Every later act resolves each source beneath the root that allowed it.
	host.MountRoots = MountRoots(class)
	host.EgressNets = class.Spec.AllowedEgressNetworks
	if class.Spec.AgentIDs == "" {
		return Resolved{Class: class, Spec: out, Host: host}, nil, nil
	}
	// Without an allocator, an unprivileged controller runs every agent
	// as itself (instance.Host.Identities).
	if host.Identities == nil && os.Geteuid() != 0 {
		own := areas.IDRange{First: uint32(os.Geteuid()), Count: 1}
		ids, msg := AgentIDs(class, areas.IDRange{First: 1, Count: 1<<32 - 2})
		if msg == "" {
			msg = CheckAgentID(class, ids, spec.Agent, own.First)
		}
		if msg != "" {
			return Resolved{}, []string{msg}, nil
		}
		return Resolved{Class: class, Spec: out, Host: host}, nil, nil
	}
	controller := areas.DefaultIDRange
	if host.Identities != nil {
		controller = host.Identities.Range()
	}
	ids, msg := AgentIDs(class, controller)
	if msg != "" {
		return Resolved{}, []string{msg}, nil
	}
	if id, ok := agentID(host.AreasRoot, spec.Agent, controller); ok {
		if msg := CheckAgentID(class, ids, spec.Agent, id); msg != "" {
			return Resolved{}, []string{msg}, nil
		}
	}
	alloc, err := areas.NewIdentities(host.AreasRoot, ids)
	if err != nil {
		return Resolved{}, nil, fmt.Errorf("agent ids of SandboxClass %s: %w", class.Name, err)
	}
	host.Identities = alloc
	return Resolved{Class: class, Spec: out, Host: host}, nil, nil
}

// agentID is the id agent was given before in root: the owner of its
// directory when that is an id of the controller's range (as
// areas.Identities records it).
func agentID(root, agent string, controller areas.IDRange) (uint32, bool) {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, agent), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, false
	}
	if st.Uid != st.Gid || !controller.Contains(st.Uid) {
		return 0, false
	}
	return st.Uid, true
}

// ErrClassUnavailable is wrapped when the cluster's SandboxClasses cannot
// be read: nothing can be described until they can.
var ErrClassUnavailable = errors.New("the SandboxClasses cannot be read")

// ForbiddenError is a Sandbox whose spec its class forbids: each violation
// names a field and the class's rule.
type ForbiddenError struct {
	Sandbox    string
	Violations []string
}

func (e *ForbiddenError) Error() string {
	return fmt.Sprintf("the SandboxClass of Sandbox %s forbids its spec: %s", e.Sandbox, strings.Join(e.Violations, "; "))
}

// Describe is the one way from a Sandbox to its instance: its class
// resolved (Resolve), its spec held to it, and the instance described
// (instance.FromSandbox) from the spec with the class applied and beneath
// the roots the class allows. It is pure: it reads the classes and the
// agent's host id and creates nothing. Its errors: ErrClassUnavailable,
// *ForbiddenError, instance.ErrNotPrepared (the agent has no id yet; only
// the Sandbox reconciler prepares one), or the spec's own error.
func Describe(ctx context.Context, c client.Reader, sb *v1alpha1.Sandbox, host instance.Host) (runtimes.Instance, Resolved, error) {
	res, violations, err := Resolve(ctx, c, &sb.Spec, host)
	if err != nil {
		return runtimes.Instance{}, Resolved{}, fmt.Errorf("%w: %w", ErrClassUnavailable, err)
	}
	if len(violations) > 0 {
		return runtimes.Instance{}, Resolved{}, &ForbiddenError{Sandbox: sb.Namespace + "/" + sb.Name, Violations: violations}
	}
	in, err := instance.FromSandbox(sb, res.Spec, res.Host)
	return in, res, err
}
