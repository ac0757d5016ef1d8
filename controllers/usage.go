package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Event reasons of usageWatcher: a command of the Sandbox was killed at its
// memory limit, or a fork was refused at its pids limit.
const (
	EventOOMKilled        = "OOMKilled"
	EventPidsLimitReached = "PidsLimitReached"
)

// usageWatcher reports what each running Sandbox of this node uses, from
// its runtime (runtimes.UsageReader): Prometheus metrics labelled by
// namespace and Sandbox, read at each scrape, and a Warning Event whenever
// a command was OOM-killed or hit the pids limit since the last look, so a
// user learns why a command died.
type usageWatcher struct {
	// informers are the manager's; Start takes the Sandboxes' store from
	// them.
	informers cache.Informers
	store     informerStore
	runtimes  map[v1alpha1.Backend]runtimes.Runtime
	node      string
	recorder  record.EventRecorder
	interval  time.Duration

	// out wakes the Sandbox reconciler for a Sandbox whose status.usage
	// no longer says what it uses: the reconciler alone writes status.
	out chan<- event.GenericEvent

	// owners say which Sandbox owns an agent's instance: another that
	// names the same agent (another tenant's) is never told its usage.
	owners *instanceOwners

	mu   sync.Mutex
	seen map[string]runtimes.Usage // by namespace/name
}

// instanceOwners are, by agent, the UID of the Sandbox whose last pass
// found it owns the agent's instance (its name and areas taken, the
// instance's record naming it). Usage is read by instance name, which
// any Sandbox naming the agent shares.
type instanceOwners struct{ m sync.Map }

// set records uid as agent's owner; a pass that finds what is recorded
// writes nothing (every pass of every Sandbox comes here).
func (o *instanceOwners) set(agent string, uid types.UID) {
	if !o.owns(agent, uid) {
		o.m.Store(agent, uid)
	}
}

// drop forgets agent's owner when it is uid.
func (o *instanceOwners) drop(agent string, uid types.UID) { o.m.CompareAndDelete(agent, uid) }

func (o *instanceOwners) owns(agent string, uid types.UID) bool {
	got, ok := o.m.Load(agent)
	return ok && got == uid
}

var (
	usageMemory = prometheus.NewDesc("sandbox_memory_bytes", "Memory the Sandbox's commands use now.", []string{"namespace", "sandbox"}, nil)
	usagePids   = prometheus.NewDesc("sandbox_processes", "Processes and threads of the Sandbox's commands now.", []string{"namespace", "sandbox"}, nil)
	usageCPU    = prometheus.NewDesc("sandbox_cpu_seconds_total", "CPU time the Sandbox's commands used since its instance started.", []string{"namespace", "sandbox"}, nil)
	usageOOM    = prometheus.NewDesc("sandbox_oom_kills_total", "Processes of the Sandbox killed at its memory limit since its instance started.", []string{"namespace", "sandbox"}, nil)
	usageForks  = prometheus.NewDesc("sandbox_pids_limit_refusals_total", "Forks refused at the Sandbox's pids limit since its instance started.", []string{"namespace", "sandbox"}, nil)
)

// usageMetrics is the one Prometheus collector of this process for the
// usage of Sandboxes: it asks every running usageWatcher at each scrape.
// A process may run more than one manager (tests do, one after another and
// side by side); each watcher joins while its manager runs, and a Sandbox
// two of them see is reported once.
var usageMetrics = &usageCollector{watchers: map[*usageWatcher]struct{}{}}

type usageCollector struct {
	register sync.Once
	err      error

	mu       sync.Mutex
	watchers map[*usageWatcher]struct{}
}

// join adds w until the returned function is called.
func (c *usageCollector) join(w *usageWatcher) (func(), error) {
	c.register.Do(func() { c.err = crmetrics.Registry.Register(c) })
	if c.err != nil {
		return nil, fmt.Errorf("registering the Sandbox usage metrics: %w", c.err)
	}
	c.mu.Lock()
	c.watchers[w] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.watchers, w)
		c.mu.Unlock()
	}, nil
}

// Describe implements prometheus.Collector.
func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{usageMemory, usagePids, usageCPU, usageOOM, usageForks} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one read of each running
// Sandbox's usage per scrape.
func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ws := make([]*usageWatcher, 0, len(c.watchers))
	for w := range c.watchers {
		ws = append(ws, w)
	}
	c.mu.Unlock()
	done := map[string]bool{}
	for _, w := range ws {
		w.each(func(sb *v1alpha1.Sandbox, u runtimes.Usage) {
			key := sb.Namespace + "/" + sb.Name
			if done[key] {
				return
			}
			done[key] = true
			l := []string{sb.Namespace, sb.Name}
			ch <- prometheus.MustNewConstMetric(usageMemory, prometheus.GaugeValue, float64(u.MemoryBytes), l...)
			ch <- prometheus.MustNewConstMetric(usagePids, prometheus.GaugeValue, float64(u.Pids), l...)
			ch <- prometheus.MustNewConstMetric(usageCPU, prometheus.CounterValue, u.CPUSeconds, l...)
			ch <- prometheus.MustNewConstMetric(usageOOM, prometheus.CounterValue, float64(u.OOMKills), l...)
			ch <- prometheus.MustNewConstMetric(usageForks, prometheus.CounterValue, float64(u.PidsLimited), l...)
		})
	}
}

// each calls fn with the usage of every Sandbox of this node whose
// runtime reports usage and whose instance has a cgroup now. The Sandbox
// is the cache's own: fn must not change it or keep it.
//
// It reads the informer's store, not a List: even without deep copies a
// List makes a SandboxList, a copy of every Sandbox's struct (0.7 KiB
// each, 7 MB at ten thousand) at each scrape and every interval, and
// the heap profile at a thousand Sandboxes caught it live. The store's
// list is a pointer a Sandbox.
func (w *usageWatcher) each(fn func(*v1alpha1.Sandbox, runtimes.Usage)) {
	for _, o := range w.store.List() {
		sb, ok := o.(*v1alpha1.Sandbox)
		if !ok || !onNode(sb, w.node) || !w.owners.owns(sb.Spec.Agent, sb.UID) {
			continue
		}
		ur, ok := w.runtimes[sb.Spec.BackendOrDefault()].(runtimes.UsageReader)
		if !ok {
			continue
		}
		u, err := ur.Usage(v1alpha1.InstanceName(sb.Spec.Agent))
		if err != nil {
			continue // not running: nothing to report
		}
		fn(sb, u)
	}
}

// informerStore is what an informer keeps: its objects, listed without a
// copy of each (client-go's Store).
type informerStore interface{ List() []any }

// sandboxStore returns the store of the informer that keeps Sandboxes.
func sandboxStore(ctx context.Context, informers cache.Informers) (informerStore, error) {
	inf, err := informers.GetInformer(ctx, &v1alpha1.Sandbox{})
	if err != nil {
		return nil, fmt.Errorf("the informer of Sandboxes: %w", err)
	}
	s, ok := inf.(interface{ GetStore() toolscache.Store })
	if !ok {
		return nil, fmt.Errorf("the informer of Sandboxes (%T) keeps no store to read", inf)
	}
	return s.GetStore(), nil
}

// Start serves the metrics while the manager runs and looks every
// interval for commands killed at a limit.
func (w *usageWatcher) Start(ctx context.Context) error {
	store, err := sandboxStore(ctx, w.informers)
	if err != nil {
		return fmt.Errorf("reading Sandboxes for their usage: %w", err)
	}
	w.store = store
	leave, err := usageMetrics.join(w)
	if err != nil {
		return err
	}
	defer leave()
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.each(func(sb *v1alpha1.Sandbox, u runtimes.Usage) {
				w.report(sb, u)
				if !equality.Semantic.DeepEqual(sb.Status.Usage, usageStatus(&u)) {
					// The cache's own object is not handed on: its key is
					// all the reconciler needs.
					key := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sb.Namespace, Name: sb.Name}}
					select {
					case w.out <- event.GenericEvent{Object: key}:
					case <-ctx.Done():
					}
				}
			})
		}
	}
}

// report sends an Event for each new OOM kill or refused fork of sb.
func (w *usageWatcher) report(sb *v1alpha1.Sandbox, u runtimes.Usage) {
	key := sb.Namespace + "/" + sb.Name
	w.mu.Lock()
	prev, known := w.seen[key]
	w.seen[key] = u
	w.mu.Unlock()
	if !known {
		prev = runtimes.Usage{}
	}
	// A restarted instance starts its counters again.
	if u.OOMKills < prev.OOMKills || u.PidsLimited < prev.PidsLimited {
		prev = runtimes.Usage{}
	}
	if n := u.OOMKills - prev.OOMKills; n > 0 {
		w.recorder.Eventf(sb, "Warning", EventOOMKilled, "%d process(es) of Sandbox %s were killed at its memory limit (%d in all since its instance started); raise spec.resources.limits.memory or use less", n, sb.Name, u.OOMKills)
	}
	if n := u.PidsLimited - prev.PidsLimited; n > 0 {
		w.recorder.Eventf(sb, "Warning", EventPidsLimitReached, "%d fork(s) in Sandbox %s were refused at its pids limit (%d in all since its instance started); raise spec.resources.pidsLimit or start fewer processes", n, sb.Name, u.PidsLimited)
	}
}

// readUsage is what the Sandbox's running instance uses, when its runtime
// says; nil otherwise.
func (r *SandboxReconciler) readUsage(s *sandboxScope) *runtimes.Usage {
	ur, ok := s.rt.(runtimes.UsageReader)
	if !ok || !s.state.Running {
		return nil
	}
	u, err := ur.Usage(s.instance.Name)
	if err != nil {
		return nil
	}
	return &u
}

// usageStatus is status.usage for u: memory rounded up to a MiB and CPU
// time down to a second, so a Sandbox doing nothing writes nothing.
func usageStatus(u *runtimes.Usage) *v1alpha1.SandboxUsage {
	if u == nil {
		return nil
	}
	const mib = 1 << 20
	mem := resource.NewQuantity((u.MemoryBytes+mib-1)/mib*mib, resource.BinarySI)
	return &v1alpha1.SandboxUsage{Memory: mem, Processes: u.Pids, CPUSeconds: int64(u.CPUSeconds),
		OOMKills: u.OOMKills, PidsLimitRefusals: u.PidsLimited}
}
