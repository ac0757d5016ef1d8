package controllers

import (
	"context"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
)

// apiServerRetry is how often an informer whose API server is away asks
// again.
const apiServerRetry = 500 * time.Millisecond

// NewInformerFor returns the manager's cache.Options.NewInformer for the
// API server cfg points at. A list or watch that fails because the API
// server is away would put the informer's reflector into client-go's
// back-off (0.8s doubling to 30s, with jitter, not configurable): after a
// 30s outage the watches came back up to about a minute later, and no
// change reached the controllers meanwhile. Here the list or watch itself
// asks again every apiServerRetry while the server is unreachable, so the
// reflector never backs off for an outage.
//
// Once the server answers again it is asked for /readyz before the watch
// is made again: a watch made while kube-apiserver is still starting (it
// accepts connections seconds before it is ready) was established, yet
// delivered the first change made after /readyz up to 5s late, which was
// most of the controller's catch-up after an outage.
func NewInformerFor(cfg *rest.Config) func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	ready := readyzProbe(cfg)
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		return toolscache.NewSharedIndexInformer(&patientListWatch{lw: toolscache.ToListerWatcherWithContext(lw), every: apiServerRetry, ready: ready}, obj, resync, indexers)
	}
}

// readyzProbe asks the API server at cfg whether it is ready. Every
// identity may read /readyz (system:public-info-viewer).
func readyzProbe(cfg *rest.Config) func(context.Context) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		// Without a client the readiness step is skipped: the watch is
		// made as soon as the server answers, as before.
		return nil
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := dc.RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}
}

// patientListWatch retries lists and watches while the API server is away,
// and after an absence waits for it to be ready.
type patientListWatch struct {
	lw    toolscache.ListerWatcherWithContext
	every time.Duration
	// ready, when set, says whether the server is ready; asked before the
	// first call after the server was away.
	ready func(context.Context) error
	away  atomic.Bool
}

func (p *patientListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return retryWhileAway(ctx, p, func() (runtime.Object, error) { return p.lw.ListWithContext(ctx, opts) })
}

func (p *patientListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return retryWhileAway(ctx, p, func() (watch.Interface, error) { return p.lw.WatchWithContext(ctx, opts) })
}

// List and Watch complete toolscache.ListerWatcher; the reflector uses the
// context variants above.
func (p *patientListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return p.ListWithContext(context.Background(), opts)
}

func (p *patientListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return p.WatchWithContext(context.Background(), opts)
}

func retryWhileAway[T any](ctx context.Context, p *patientListWatch, call func() (T, error)) (T, error) {
	var zero T
	for {
		if p.away.Load() && p.ready != nil {
			if err := p.ready(ctx); err != nil {
				select {
				case <-ctx.Done():
					return zero, err
				case <-time.After(p.every):
				}
				continue
			}
			p.away.Store(false)
		}
		v, err := call()
		if err == nil || !apiServerAway(err) {
			return v, err
		}
		p.away.Store(true)
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(p.every):
		}
	}
}

// apiServerAway says whether err means the API server (or what is in front
// of it) is not answering yet, rather than refusing the request. Too many
// requests is not among them: the reflector's back-off is what the server
// asks for then.
func apiServerAway(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		apierrors.IsServiceUnavailable(err)
}
