package sandboxtoml

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// DefaultSettle is how long the file must be quiet before a change is read:
// editors write in several steps (truncate then write, or write a temporary
// file then rename), and reading between two steps would see a file that
// is empty or half-written.
const DefaultSettle = 100 * time.Millisecond

// emptyGrace is how long an empty file must stay empty before it is read as
// the defaults.
const emptyGrace = time.Second

// Snapshot is one whole, valid configuration. Snapshots are never modified
// once published; a reload publishes a new one.
type Snapshot struct {
	Spec *v1alpha1.SandboxSpec
	// Generation counts the configurations published, starting at 1.
	Generation int64
}

// WatchOptions tune a Watcher.
type WatchOptions struct {
	// Settle overrides DefaultSettle.
	Settle time.Duration
	// OnReload is called after a changed, valid configuration was published.
	OnReload func(Snapshot)
	// OnError is called when the file changed but cannot be used; the
	// last good configuration stays current.
	OnError func(error)
}

// Watcher keeps the current configuration of one sandbox.toml. It watches
// the file's directory rather than the file, so that an editor replacing
// the file by renaming a new one over it is seen, and so that a file
// created after the watcher started is picked up.
type Watcher struct {
	path, agent string
	opts        WatchOptions
	fs          *fsnotify.Watcher
	current     atomic.Pointer[Snapshot]
	done        chan struct{}
	closeOnce   sync.Once
	// emptySince is when the file was first seen empty; only the loop uses it.
	emptySince time.Time
}

// Watch loads path for agent and keeps it current until ctx ends or Close
// is called. The first load must succeed: there is no last good
// configuration to keep yet.
func Watch(ctx context.Context, path, agent string, opts WatchOptions) (*Watcher, error) {
	if opts.Settle <= 0 {
		opts.Settle = DefaultSettle
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("watching sandbox configuration %s: %w", path, err)
	}
	spec, err := Load(path, agent)
	if err != nil {
		return nil, err
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching sandbox configuration %s: %w", path, err)
	}
	if err := fsw.Add(filepath.Dir(abs)); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("watching the directory of sandbox configuration %s: %w", path, err)
	}
	w := &Watcher{path: path, agent: agent, opts: opts, fs: fsw, done: make(chan struct{})}
	w.current.Store(&Snapshot{Spec: spec, Generation: 1})
	go w.loop(ctx, filepath.Clean(abs))
	return w, nil
}

// Current is the configuration in force: the last one that loaded
// without error. Commands take it once and use it whole.
func (w *Watcher) Current() Snapshot {
	return *w.current.Load()
}

// Close stops watching. Current keeps returning the last configuration.
func (w *Watcher) Close() error {
	var err error
	w.closeOnce.Do(func() {
		err = w.fs.Close()
		<-w.done
	})
	return err
}

func (w *Watcher) loop(ctx context.Context, abs string) {
	defer close(w.done)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-ctx.Done():
			w.fs.Close()
			return
		case ev, ok := <-w.fs.Events:
			if !ok {
				return
			}
			if filepath.Clean(ev.Name) == abs {
				settle.Reset(w.opts.Settle)
			}
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			w.report(fmt.Errorf("watching sandbox configuration %s: %w; keeping the last good configuration", w.path, err))
		case <-settle.C:
			if !w.reload() {
				settle.Reset(w.opts.Settle)
			}
		}
	}
}

// reload publishes the file's configuration when it is valid and differs
// from the current one. An unchanged file (an editor touching it) is not a
// new generation. It returns false when the file changed while it was
// read: that read may be half of an edit, so it is tried again once the
// file settles.
//
// An empty file is most often the moment between an in-place writer's
// truncate and its write, so it is taken only once it has stayed empty for
// emptyGrace; a file that is really emptied then means the defaults.
func (w *Watcher) reload() bool {
	before := fileStamp(w.path)
	if before.exists && before.size == 0 {
		if w.emptySince.IsZero() {
			w.emptySince = time.Now()
		}
		if time.Since(w.emptySince) < max(emptyGrace, 10*w.opts.Settle) {
			return false
		}
	} else {
		w.emptySince = time.Time{}
	}
	spec, err := Load(w.path, w.agent)
	if fileStamp(w.path) != before {
		return false
	}
	if err != nil {
		w.report(fmt.Errorf("reloading sandbox configuration: %w; keeping the last good configuration (generation %d)", err, w.Current().Generation))
		return true
	}
	cur := w.current.Load()
	if equalSpecs(cur.Spec, spec) {
		return true
	}
	next := &Snapshot{Spec: spec, Generation: cur.Generation + 1}
	w.current.Store(next)
	if w.opts.OnReload != nil {
		w.opts.OnReload(*next)
	}
	return true
}

// stamp identifies one version of a file well enough to notice a write
// racing with a read.
type stamp struct {
	exists  bool
	size    int64
	modTime time.Time
	ino     uint64
}

func fileStamp(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	st := stamp{exists: true, size: fi.Size(), modTime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

func (w *Watcher) report(err error) {
	if w.opts.OnError != nil {
		w.opts.OnError(err)
	}
}

func equalSpecs(a, b *v1alpha1.SandboxSpec) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}
