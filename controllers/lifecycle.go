package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/instance"
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
	err := o.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &v1alpha1.Sandbox{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

// shutdownGate keeps Sandbox reconciles and the shutdown stop apart: once
// the manager is stopping, no reconcile may start an instance the stopper
// has just stopped.
type shutdownGate struct {
	mu     sync.RWMutex
	closed bool
}

// enter admits a reconcile unless shutdown has begun; leave must follow.
func (g *shutdownGate) enter() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	return true
}

func (g *shutdownGate) leave() { g.mu.RUnlock() }

// close waits for running reconciles and admits no more.
func (g *shutdownGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
}

// shutdownStopper stops, when the manager shuts down, the running instances
// whose policy asks for it (incus shutdownOnExit, default true). The others
// keep running and a restarted controller adopts them.
type shutdownStopper struct {
	gate     *shutdownGate
	reader   client.Reader
	runtimes map[v1alpha1.Backend]runtimes.Runtime
	opts     Options
}

func (s *shutdownStopper) NeedLeaderElection() bool { return false }

func (s *shutdownStopper) Start(ctx context.Context) error {
	<-ctx.Done()
	s.gate.close()
	logger := log.FromContext(ctx).WithName("shutdown")
	// The manager's context is gone; the stop gets a bounded one of its own.
	stopCtx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	var list v1alpha1.SandboxList
	if err := s.reader.List(stopCtx, &list); err != nil {
		logger.Error(err, "listing Sandboxes to stop on exit; instances are left running")
		return nil
	}
	for i := range list.Items {
		sb := &list.Items[i]
		if !onNode(sb, s.opts.NodeName) {
			continue
		}
		rt, ok := s.runtimes[sb.Spec.BackendOrDefault()]
		if !ok {
			continue
		}
		in, err := instance.FromSandbox(sb, nil, s.opts.Host, nil)
		if err != nil || !in.StopOnExit {
			continue
		}
		st, err := rt.Inspect(stopCtx, in.Name)
		if err != nil || !st.Running || st.Owner != in.Owner {
			continue
		}
		if err := rt.Stop(stopCtx, in.Name); err != nil {
			logger.Error(err, "stopping instance on exit", "instance", in.Name)
			continue
		}
		logger.Info("stopped instance on exit (shutdownOnExit)", "instance", in.Name)
	}
	return nil
}
