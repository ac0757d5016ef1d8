package testharness

import (
	"net/http"
	"strings"
	"sync"
)

// Writes counts the requests that change something (every verb but GET)
// a manager's client sends, by the object they name: "<resource>/<namespace>/<name>",
// a subresource counted with its object. The claim benchmark divides them
// by the claims that caused them.
type Writes struct {
	mu    sync.Mutex
	count map[string]int
	held  map[string]chan struct{}
}

// Hold makes the manager's writes of one object wait until release is
// called: a test stands a write on its way to the API server for as long
// as it likes.
func (w *Writes) Hold(resource, namespace, name string) (release func()) {
	key := resource + "/" + namespace + "/" + name
	ch := make(chan struct{})
	w.mu.Lock()
	if w.held == nil {
		w.held = map[string]chan struct{}{}
	}
	w.held[key] = ch
	w.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			delete(w.held, key)
			w.mu.Unlock()
			close(ch)
		})
	}
}

// heldFor is the channel a write of the request's object waits on, nil
// when it goes at once.
func (w *Writes) heldFor(r *http.Request) chan struct{} {
	if r.Method == http.MethodGet {
		return nil
	}
	key, ok := objectOf(r.URL.Path)
	if !ok {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held[key]
}

// Of is how many writes named the object so far.
func (w *Writes) Of(resource, namespace, name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count[resource+"/"+namespace+"/"+name]
}

// Total is how many writes of that resource named an object whose name
// starts with prefix, in namespace.
func (w *Writes) Total(resource, namespace, prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k, c := range w.count {
		if strings.HasPrefix(k, resource+"/"+namespace+"/"+prefix) {
			n += c
		}
	}
	return n
}

func (w *Writes) record(r *http.Request) {
	if r.Method == http.MethodGet {
		return
	}
	key, ok := objectOf(r.URL.Path)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.count == nil {
		w.count = map[string]int{}
	}
	w.count[key]++
}

// objectOf reads ".../namespaces/<ns>/<resource>/<name>[/<sub>]" as
// "<resource>/<ns>/<name>"; a create (no name) is "<resource>/<ns>/".
func objectOf(path string) (string, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p != "namespaces" || i+2 >= len(parts) {
			continue
		}
		ns, resource, name := parts[i+1], parts[i+2], ""
		if i+3 < len(parts) {
			name = parts[i+3]
		}
		return resource + "/" + ns + "/" + name, true
	}
	return "", false
}

type countingTransport struct {
	next   http.RoundTripper
	writes *Writes
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if ch := t.writes.heldFor(r); ch != nil {
		select {
		case <-ch:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	t.writes.record(r)
	return t.next.RoundTrip(r)
}
