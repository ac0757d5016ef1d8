package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// apiServerRetry is how often an informer whose API server is away asks
// again.
const apiServerRetry = 500 * time.Millisecond

// NewInformer is the manager's cache.Options.NewInformer. A list or watch
// that fails because the API server is away would put the informer's
// reflector into client-go's back-off (0.8s doubling to 30s, with jitter,
// not configurable): after a 30s outage the watches came back up to about
// a minute later, and no change reached the controllers meanwhile. Here
// the list or watch itself asks again every apiServerRetry while the
// server is unreachable, so the reflector never backs off for an outage
// and the watches resume within about half a second of the server.
func NewInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	return toolscache.NewSharedIndexInformer(&patientListWatch{lw: toolscache.ToListerWatcherWithContext(lw), every: apiServerRetry}, obj, resync, indexers)
}

// patientListWatch retries lists and watches while the API server is away.
type patientListWatch struct {
	lw    toolscache.ListerWatcherWithContext
	every time.Duration
}

func (p *patientListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return retryWhileAway(ctx, p.every, func() (runtime.Object, error) { return p.lw.ListWithContext(ctx, opts) })
}

func (p *patientListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return retryWhileAway(ctx, p.every, func() (watch.Interface, error) { return p.lw.WatchWithContext(ctx, opts) })
}

// List and Watch complete toolscache.ListerWatcher; the reflector uses the
// context variants above.
func (p *patientListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return p.ListWithContext(context.Background(), opts)
}

func (p *patientListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return p.WatchWithContext(context.Background(), opts)
}

func retryWhileAway[T any](ctx context.Context, every time.Duration, call func() (T, error)) (T, error) {
	for {
		v, err := call()
		if err == nil || !apiServerAway(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(every):
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
