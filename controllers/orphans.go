package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// orphanCollector deletes instances this controller made whose Sandbox no
// longer exists, at start and then every interval. It reads the API server
// directly: a cache that has not synced yet must not make a live Sandbox
// look gone.
type orphanCollector struct {
	reader   client.Reader
	runtimes map[v1alpha1.Backend]runtimes.Runtime
	interval time.Duration
	// node is this controller's node: an instance whose Sandbox moved to
	// another node (onNodeLost: Move) is an orphan here too.
	node string
}

func (o *orphanCollector) NeedLeaderElection() bool { return false }

func (o *orphanCollector) Start(ctx context.Context) error {
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		o.collect(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (o *orphanCollector) collect(ctx context.Context) {
	logger := log.FromContext(ctx).WithName("orphans")
	for backend, rt := range o.runtimes {
		states, err := rt.List(ctx)
		if err != nil {
			logger.Error(err, "listing instances", "backend", backend)
			continue
		}
		for _, st := range states {
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
			logger.Info("deleted orphaned instance; host areas kept", "instance", st.Name, "owner", st.Owner, "backend", backend)
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
