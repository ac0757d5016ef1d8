package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// orphanCollector deletes instances this controller made whose Sandbox no
// longer exists, at start and then every interval. It reads the API server
// directly: a cache that has not synced yet must not make a live Sandbox
// look gone.
type orphanCollector struct {
	reader   client.Reader
	runtimes map[v1alpha1.Backend]runtimes.Runtime
	// networks, when set, are the instances' network namespaces: one
	// whose instance is gone from every runtime, and which no proxy of
	// this process serves, is removed.
	networks *egress.Networks
	interval time.Duration
	// node is this controller's node: an instance whose Sandbox moved to
	// another node (onNodeLost: Move) is an orphan here too.
	node string
	// informers, when set with node, wake the collector as soon as a
	// Sandbox this node ran is placed on another node, rather than at the
	// next interval: a node counted lost while it was not (cut off from
	// the API server for a while, say) would otherwise run the Sandbox
	// beside its new node for up to interval.
	informers cache.Informers
	wake      chan struct{}
}

func (o *orphanCollector) NeedLeaderElection() bool { return false }

func (o *orphanCollector) Start(ctx context.Context) error {
	o.wake = make(chan struct{}, 1)
	if o.informers != nil && o.node != "" {
		inf, err := o.informers.GetInformer(ctx, &v1alpha1.Sandbox{})
		if err != nil {
			return fmt.Errorf("watching Sandboxes for those that leave this node: %w", err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: o.movedAway}); err != nil {
			return fmt.Errorf("watching Sandboxes for those that leave this node: %w", err)
		}
	}
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		o.collect(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-o.wake:
		}
	}
}

// movedAway wakes the collector when a Sandbox on this node is now on
// another.
func (o *orphanCollector) movedAway(oldObj, newObj any) {
	before, ok := oldObj.(*v1alpha1.Sandbox)
	after, ok2 := newObj.(*v1alpha1.Sandbox)
	if !ok || !ok2 || before.Node() != o.node || after.Node() == o.node || after.Node() == "" {
		return
	}
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *orphanCollector) collect(ctx context.Context) {
	logger := log.FromContext(ctx).WithName("orphans")
	live := map[string]bool{}
	listed := true
	for backend, rt := range o.runtimes {
		states, err := rt.List(ctx)
		if err != nil {
			logger.Error(err, "listing instances", "backend", backend)
			listed = false
			continue
		}
		for _, st := range states {
			live[st.Name] = true
			gone, err := o.ownerGone(ctx, st.Owner)
			if err != nil {
				logger.Error(err, "looking up the owner of an instance", "instance", st.Name, "owner", st.Owner)
				continue
			}
			if !gone {
				continue
			}
			if err := rt.Delete(ctx, st.Name); err != nil {
				logger.Error(err, "deleting orphaned instance", "instance", st.Name, "owner", st.Owner)
				continue
			}
			delete(live, st.Name)
			logger.Info("deleted orphaned instance; host areas kept", "instance", st.Name, "owner", st.Owner, "backend", backend)
		}
	}
	if o.networks != nil && listed {
		for _, name := range o.networks.Prune(func(name string) bool { return live[name] }) {
			logger.Info("removed the network namespace of a gone instance", "instance", name)
		}
	}
}

func (o *orphanCollector) ownerGone(ctx context.Context, owner string) (bool, error) {
	ns, name, ok := strings.Cut(owner, "/")
	if !ok || ns == "" || name == "" {
		return false, fmt.Errorf("owner %q is not <namespace>/<name>; leaving the instance alone", owner)
	}
	var sb v1alpha1.Sandbox
	err := o.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return o.node != "" && sb.Node() != "" && sb.Node() != o.node, nil
}
