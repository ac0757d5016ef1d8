package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// +kubebuilder:rbac:groups=sandbox.cireilclaw.dev,resources=sandboxclasses,verbs=get;list;watch

// describe holds the Sandbox to its SandboxClass and describes its
// instance (sandboxclass.Describe, the one way every caller takes), before
// anything of it starts, whatever admission let in: the admission policy
// may not be installed, and a class may have changed since the Sandbox was
// written. An agent without a host id yet is prepared here, the one place
// that creates anything for it (instance.Prepare), and only once its class
// allows its spec, so a forbidden spec creates nothing on the host. A
// running instance is left to the phases after only when the class allows
// it; otherwise it is stopped, since what it binds is no longer allowed.
func (r *SandboxReconciler) describe(ctx context.Context, s *sandboxScope) (bool, error) {
	in, res, err := sandboxclass.Describe(ctx, r.Client, s.sb, r.Host)
	if err == nil || errors.Is(err, instance.ErrNotPrepared) {
		// Its class allows the spec: the agent gets its id, its directory
		// and its areas, if it has not (idempotent, a few stats when all
		// is there), so that the exec API's file requests find them.
		if perr := instance.Prepare(res.Spec, res.Host); perr != nil {
			err = perr
		} else if err != nil {
			in, _, err = sandboxclass.Describe(ctx, r.Client, s.sb, r.Host)
		}
	}
	var forbidden *sandboxclass.ForbiddenError
	switch {
	case errors.Is(err, sandboxclass.ErrClassUnavailable):
		return false, err
	case errors.As(err, &forbidden):
		msg := strings.Join(forbidden.Violations, "; ")
		if c := findCondition(s.sb.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonClassForbids || c.Message != msg {
			r.Recorder.Event(s.sb, "Warning", v1alpha1.ReasonClassForbids, msg)
			log.FromContext(ctx).Info("the Sandbox's class forbids its spec; nothing starts", "problem", msg)
		}
		s.facts.fail(v1alpha1.ReasonClassForbids, msg)
		return true, r.stopForbidden(ctx, s, msg)
	case err != nil:
		s.facts.fail(v1alpha1.ReasonInvalidSpec, err.Error())
		return true, nil
	}
	r.warnDeprecated(s.sb)
	var mounted []string
	if conditionTrue(s.sb.Status.Conditions, v1alpha1.ConditionReady) {
		mounted = s.sb.Status.MountedGitDirs
	}
	in = instance.WithGitDirs(in, gitDirsToBind(s.claims, mounted))
	if r.PodCgroups != nil {
		// On a cluster a Sandbox runs in its Pod's cgroup, a pinned one too:
		// nothing starts before the kubelet runs the Pod's container.
		cg, err := r.podCgroup(s.sb.Status.Pod)
		if err != nil {
			s.facts.fail(v1alpha1.ReasonPodStarting, err.Error())
			if p := s.sb.Status.Pod; p != nil && p.ContainerID != "" {
				// The placer's write of the Pod and its container brings
				// the Sandbox back; the kubelet making the cgroup does not.
				s.retry = podStartRetry
			}
			return true, nil
		}
		p := s.sb.Status.Pod
		in = instance.WithPod(in, runtimes.Pod{UID: p.UID, Cgroup: cg, CgroupRoot: r.PodCgroupRoot})
		if in.Image != "" && s.sb.Spec.BackendOrDefault() == v1alpha1.BackendBwrap {
			// The image is the file system of the Pod's container.
			_, id, _ := strings.Cut(p.ContainerID, "://")
			in = instance.WithImageContainer(in, id)
		}
	} else if b := s.sb.Spec.Bwrap; b != nil && b.Image != "" {
		s.facts.fail(v1alpha1.ReasonInvalidSpec, "spec.bwrap.image: a bwrap Sandbox runs over an image only on a cluster, where its Pod's container holds the image; this controller runs Sandboxes on its own machine (no --pod-cgroups), whose commands see the machine's directories: remove spec.bwrap.image, or run the Sandbox on a cluster")
		return true, nil
	}
	s.instance, s.gitDirs = in, instance.GitDirs(in)
	return false, nil
}

// podCgroup is the cgroup on this node the Sandbox's processes run below:
// its Pod's container's.
func (r *SandboxReconciler) podCgroup(p *v1alpha1.SandboxPod) (string, error) {
	switch {
	case p == nil:
		return "", errors.New("waiting for the Sandbox's Pod, which its processes run in (the aggregated API makes it, kube-scheduler binds it)")
	case p.ContainerID == "":
		return "", fmt.Errorf("waiting for the kubelet to start the container of the Sandbox's Pod %s, which its processes run in", p.Name)
	}
	cg, err := r.PodCgroups.Find(p.UID, p.ContainerID)
	if err != nil {
		return "", fmt.Errorf("the cgroup of the Sandbox's Pod %s, which its processes run in, is not on this node yet: %w", p.Name, err)
	}
	return cg, nil
}

// podStartRetry is how often a Pod's cgroup is looked for while the
// kubelet starts the Pod: nothing announces it.
const podStartRetry = 2 * time.Second

// warnDeprecated says, once per generation, which deprecated fields a
// Sandbox still uses and what replaces them.
func (r *SandboxReconciler) warnDeprecated(sb *v1alpha1.Sandbox) {
	fields := sb.Spec.UsesDeprecatedLimits()
	if len(fields) == 0 {
		return
	}
	if gen, seen := r.warned.Swap(sb.UID, sb.Generation); seen && gen == sb.Generation {
		return
	}
	r.Recorder.Eventf(sb, "Warning", EventDeprecatedField, "the Sandbox sets deprecated fields, read for one more release: %s", strings.Join(fields, "; "))
}

// EventDeprecatedField is the reason of the Event that names deprecated
// fields a Sandbox sets.
const EventDeprecatedField = "DeprecatedField"

// stopForbidden stops an instance this Sandbox owns that runs a spec its
// class no longer allows (the class changed under it).
func (r *SandboxReconciler) stopForbidden(ctx context.Context, s *sandboxScope, why string) error {
	name := v1alpha1.InstanceName(s.sb.Spec.Agent)
	// Its egress proxy serves what the class allowed: no longer.
	if err := r.releaseNetwork(name, s.sb); err != nil {
		return fmt.Errorf("releasing the egress proxy of %s, which its SandboxClass no longer allows: %w", name, err)
	}
	st, err := s.rt.Inspect(ctx, name)
	if err != nil || !st.Exists || !st.Running || st.Owner != s.owner {
		// Inspect failing is not this phase's to report: the condition
		// already says why the Sandbox is not Ready.
		return nil //nolint:nilerr // reported by the condition already set, not by this phase
	}
	if err := s.rt.Stop(ctx, name); err != nil {
		return fmt.Errorf("stopping instance %s, which its SandboxClass no longer allows: %w", name, err)
	}
	r.Recorder.Eventf(s.sb, "Warning", v1alpha1.ReasonClassForbids, "stopped instance %s: %s", name, why)
	return nil
}

// classSandboxes re-queues every Sandbox of this node when a class
// changes: which class a Sandbox gets depends on every class (the default
// label, a name appearing), and classes change rarely.
func (r *SandboxReconciler) classSandboxes(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.SandboxList
	if err := r.List(ctx, &list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if onNode(&list.Items[i], r.NodeName) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}
