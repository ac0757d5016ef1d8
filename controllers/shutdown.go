package controllers

import (
	"context"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

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
		in, _, err := sandboxclass.Describe(stopCtx, s.reader, sb, s.opts.Host)
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
