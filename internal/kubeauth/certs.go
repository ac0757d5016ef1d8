package kubeauth

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// CA is a bundle of certificate authorities that may change while it is
// used: a file read again, a ConfigMap watched. Until a bundle is loaded
// it trusts nothing.
type CA struct {
	name string
	pool atomic.Pointer[x509.CertPool]
	pem  atomic.Pointer[[]byte]
}

// StaticCA is a bundle that never changes; name says what it is in
// errors.
func StaticCA(name string, bundle []byte) (*CA, error) {
	c := &CA{name: name}
	if err := c.set(bundle); err != nil {
		return nil, err
	}
	if c.Pool() == nil {
		return nil, fmt.Errorf("%s: no certificate in the bundle", name)
	}
	return c, nil
}

// Pool is the bundle now, nil before one is loaded.
func (c *CA) Pool() *x509.CertPool { return c.pool.Load() }

// set takes bundle (PEM) as the CAs from now on; an empty bundle trusts
// nothing. A bundle that does not parse leaves the CAs as they were.
func (c *CA) set(bundle []byte) error {
	if old := c.pem.Load(); old != nil && bytes.Equal(*old, bundle) {
		return nil
	}
	if len(bytes.TrimSpace(bundle)) == 0 {
		c.pool.Store(nil)
		c.pem.Store(&bundle)
		return nil
	}
	pool := x509.NewCertPool()
	rest, n := bundle, 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return fmt.Errorf("%s: certificate %d: %w", c.name, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s: no PEM certificate in the bundle", c.name)
	}
	c.pool.Store(pool)
	c.pem.Store(&bundle)
	return nil
}

// fileCheckEvery is how often a CA file is read again.
const fileCheckEvery = 10 * time.Second

// FileCA reads a bundle from path now (failing when it cannot) and, while
// Watch runs, again whenever its content changes.
func FileCA(name, path string) (*CA, error) {
	c := &CA{name: name + " (" + path + ")"}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := c.set(b); err != nil {
		return nil, err
	}
	if c.Pool() == nil {
		return nil, fmt.Errorf("%s: no certificate in the bundle", c.name)
	}
	return c, nil
}

// WatchFile reads path again every few seconds until ctx ends, keeping
// the last bundle that parsed; report hears of each one that did not.
func (c *CA) WatchFile(ctx context.Context, path string, report func(error)) {
	t := time.NewTicker(fileCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, err := os.ReadFile(path)
		if err == nil {
			err = c.set(b)
		}
		if err != nil && report != nil {
			report(err)
		}
	}
}

// verify checks the request's client certificate chain against ca for
// client authentication; nil chain when the request sends no
// certificate.
func verify(r *http.Request, ca *CA) (*x509.Certificate, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, nil
	}
	pool := ca.Pool()
	if pool == nil {
		return nil, fmt.Errorf("%s: not loaded yet, client certificates are refused", ca.name)
	}
	certs := r.TLS.PeerCertificates
	opts := x509.VerifyOptions{
		Roots:         pool,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return nil, fmt.Errorf("client certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	return certs[0], nil
}

// ClientCert authenticates a client certificate signed by ca: the user is
// its common name, the groups its organisations.
func ClientCert(ca *CA) Authenticator {
	return AuthenticatorFunc(func(r *http.Request) (*User, bool, error) {
		cert, err := verify(r, ca)
		if err != nil || cert == nil {
			return nil, false, err
		}
		if cert.Subject.CommonName == "" {
			return nil, false, errors.New("client certificate without a common name")
		}
		return &User{Name: cert.Subject.CommonName, Groups: slices.Clone(cert.Subject.Organization)}, true, nil
	})
}

// HeaderNames say which request headers a trusted proxy names the caller
// in, and which of its certificates' common names are trusted (none: any
// the CA signed).
type HeaderNames struct {
	AllowedNames  []string
	User          []string
	UID           []string
	Group         []string
	ExtraPrefixes []string
}

// RequestHeader authenticates a trusted proxy: a client certificate of
// ca (with one of the allowed common names, when names has any), the
// caller named in the request's headers. names is asked at each request,
// so it may change. Only a verified proxy's headers are read: without its
// certificate the request is not authenticated here, whatever it says.
func RequestHeader(ca *CA, names func() HeaderNames) Authenticator {
	return AuthenticatorFunc(func(r *http.Request) (*User, bool, error) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			return nil, false, nil
		}
		n := names()
		cert, err := verify(r, ca)
		if err != nil || cert == nil {
			return nil, false, err
		}
		if len(n.AllowedNames) > 0 && !slices.Contains(n.AllowedNames, cert.Subject.CommonName) {
			return nil, false, fmt.Errorf("client certificate %q is not one of the proxies allowed (%s)", cert.Subject.CommonName, strings.Join(n.AllowedNames, ", "))
		}
		u := &User{Name: firstValue(r.Header, n.User), UID: firstValue(r.Header, n.UID)}
		if u.Name == "" {
			return nil, false, nil
		}
		for _, h := range n.Group {
			u.Groups = append(u.Groups, r.Header.Values(h)...)
		}
		for k, vs := range r.Header {
			for _, p := range n.ExtraPrefixes {
				rest, found := cutPrefixFold(k, p)
				if !found || rest == "" {
					continue
				}
				key, err := url.PathUnescape(rest)
				if err != nil {
					key = rest
				}
				if u.Extra == nil {
					u.Extra = map[string][]string{}
				}
				key = strings.ToLower(key)
				u.Extra[key] = append(u.Extra[key], vs...)
			}
		}
		return u, true, nil
	})
}

func firstValue(h http.Header, names []string) string {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			return v
		}
	}
	return ""
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

// ConfigMap is one ConfigMap's data, read once by Load and kept current
// by Run, for what authentication reads from it.
type ConfigMap struct {
	Kube            kubernetes.Interface
	Namespace, Name string

	mu       sync.Mutex
	data     map[string]string
	onChange []func(map[string]string)
	loaded   atomic.Bool
	// fromRV is the resource version the last Load read, for Run's first
	// watch to start from instead of reading the ConfigMap again.
	fromRV string
}

// Data is what the ConfigMap held at the last look (nil: none yet).
func (c *ConfigMap) Data() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.data
}

// Loaded reports whether the ConfigMap has been read once.
func (c *ConfigMap) Loaded() bool { return c.loaded.Load() }

// OnChange calls fn with the data now and after each change.
func (c *ConfigMap) OnChange(fn func(map[string]string)) {
	c.mu.Lock()
	c.onChange = append(c.onChange, fn)
	d := c.data
	c.mu.Unlock()
	fn(d)
}

func (c *ConfigMap) store(d map[string]string) {
	c.mu.Lock()
	c.data = d
	fns := slices.Clone(c.onChange)
	c.mu.Unlock()
	c.loaded.Store(true)
	for _, fn := range fns {
		fn(d)
	}
}

// Load reads the ConfigMap once; one that does not exist reads as empty.
// It returns the resource version to watch from.
func (c *ConfigMap) Load(ctx context.Context) (string, error) {
	cm, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.store(nil)
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading ConfigMap %s/%s: %w", c.Namespace, c.Name, err)
	}
	c.store(cm.Data)
	c.mu.Lock()
	c.fromRV = cm.ResourceVersion
	c.mu.Unlock()
	return cm.ResourceVersion, nil
}

// Run keeps the data current until ctx ends: a watch on the one
// ConfigMap, started again (after a fresh read) whenever it ends. report
// hears of failures, which are tried again after a pause.
func (c *ConfigMap) Run(ctx context.Context, report func(error)) {
	pause := time.Second
	for ctx.Err() == nil {
		if err := c.watchOnce(ctx); err != nil && ctx.Err() == nil {
			if report != nil {
				report(err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 30*time.Second)
			continue
		}
		pause = time.Second
	}
}

func (c *ConfigMap) watchOnce(ctx context.Context) error {
	// A Load just before (the caller's first read) is where the watch
	// starts; after that, each watch starts from a fresh read.
	c.mu.Lock()
	rv := c.fromRV
	c.fromRV = ""
	c.mu.Unlock()
	if rv == "" {
		var err error
		if rv, err = c.Load(ctx); err != nil {
			return err
		}
		c.mu.Lock()
		c.fromRV = ""
		c.mu.Unlock()
	}
	w, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", c.Name).String(),
		ResourceVersion: rv,
	})
	if err != nil {
		return fmt.Errorf("watching ConfigMap %s/%s: %w", c.Namespace, c.Name, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil // the server ended it: read and watch again
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if cm, ok := ev.Object.(*corev1.ConfigMap); ok {
					c.store(cm.Data)
				}
			case watch.Deleted:
				c.store(nil)
			case watch.Error:
				return fmt.Errorf("watching ConfigMap %s/%s: %v", c.Namespace, c.Name, ev.Object)
			}
		}
	}
}

// CAFrom is a CA kept equal to the bundle under key of cm; report hears
// of a bundle that does not parse (the one before stays).
func CAFrom(name string, cm *ConfigMap, key string, report func(error)) *CA {
	c := &CA{name: name}
	cm.OnChange(func(d map[string]string) {
		if err := c.set([]byte(d[key])); err != nil && report != nil {
			report(err)
		}
	})
	return c
}

// HeaderNamesFrom reads the proxy's header names as the API server
// publishes them in ConfigMap kube-system/extension-apiserver-authentication:
// each key a JSON list of strings.
func HeaderNamesFrom(cm *ConfigMap, allowedKey, userKey, uidKey, groupKey, extraKey string) func() HeaderNames {
	var cur atomic.Pointer[HeaderNames]
	cm.OnChange(func(d map[string]string) {
		bad := false
		list := func(k string) []string {
			var out []string
			if v := d[k]; v != "" && json.Unmarshal([]byte(v), &out) != nil {
				bad = true
			}
			return out
		}
		n := HeaderNames{AllowedNames: list(allowedKey), User: list(userKey), UID: list(uidKey),
			Group: list(groupKey), ExtraPrefixes: list(extraKey)}
		if bad {
			// Names that do not parse could widen whom the proxy's
			// certificate covers: trust no proxy until they do.
			n = HeaderNames{}
		}
		cur.Store(&n)
	})
	return func() HeaderNames { return *cur.Load() }
}
