// Package sandboxclient is the client side for Go programs: claim a
// Sandbox (a SessionClaim, waited on until Ready), run commands in it with
// streams, move files, release it. Claims go through controller-runtime's
// client; commands and files through the claim's exec API, behind the API
// server's aggregated API when it serves it, else on the Sandbox's node
// (status.endpoint) with the configuration's client certificate.
//
//	c, _ := sandboxclient.New(cfg, sandboxclient.Options{Namespace: "team-a"})
//	claim, err := c.Claim(ctx, "alice", sandboxclient.ClaimOptions{})
//	defer claim.Release(context.Background())
//	code, err := claim.Exec(ctx, []string{"git", "status"}, nil, os.Stdout, os.Stderr)
package sandboxclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// ErrRefused is wrapped when the sandbox's policy refused a command:
// nothing ran.
var ErrRefused = errors.New("command refused")

// NotReadyError says why a claim did not become Ready in time: its Ready
// condition's reason and message.
type NotReadyError struct {
	Claim, Reason, Message string
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("SessionClaim %s is not Ready: %s: %s", e.Claim, e.Reason, e.Message)
}

// Options configure a Client.
type Options struct {
	// Namespace of the claims; default "default".
	Namespace string
	// Via is "api-server" or "node"; default api-server when the API
	// server serves the aggregated API.
	Via string
	// APIToken, for a node, is a token issued for the exec API's
	// audience; the configuration's own token is never sent to a node.
	APIToken string
	// SystemNamespace is where the exec API's CA is published.
	SystemNamespace string
}

// Client claims Sandboxes and reaches their exec API.
type Client struct {
	cfg  *rest.Config
	kube client.Client
	opts Options
}

// New is a Client for the cluster cfg reaches.
func New(cfg *rest.Config, opts Options) (*Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	if opts.SystemNamespace == "" {
		opts.SystemNamespace = servingcert.DefaultNamespace
	}
	return &Client{cfg: cfg, kube: kube, opts: opts}, nil
}

// ClaimOptions shape a claim.
type ClaimOptions struct {
	// Name of the SessionClaim; default the Sandbox's name and a random suffix.
	Name string
	// Worktree asks for a git worktree of the session's own.
	Worktree *v1alpha1.WorktreeSpec
	// Timeout for Ready; default two minutes.
	Timeout time.Duration
}

// Claim creates a SessionClaim of the Sandbox and waits until it is Ready;
// when it is not in time, the claim is released and a *NotReadyError says
// why.
func (c *Client) Claim(ctx context.Context, sandbox string, opts ClaimOptions) (*Claim, error) {
	if opts.Name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		opts.Name = sandbox + "-" + hex.EncodeToString(b[:])
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Minute
	}
	sc := &v1alpha1.SessionClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.opts.Namespace, Name: opts.Name},
		Spec:       v1alpha1.SessionClaimSpec{SandboxName: sandbox, Worktree: opts.Worktree},
	}
	if err := c.kube.Create(ctx, sc); err != nil {
		return nil, fmt.Errorf("creating SessionClaim %s/%s: %w", sc.Namespace, sc.Name, err)
	}
	cl := &Claim{c: c, Namespace: sc.Namespace, Name: sc.Name}
	if err := cl.WaitReady(ctx, opts.Timeout); err != nil {
		return nil, errors.Join(err, cl.Release(context.WithoutCancel(ctx)))
	}
	return cl, nil
}

// Use is a claim that exists already.
func (c *Client) Use(name string) *Claim {
	return &Claim{c: c, Namespace: c.opts.Namespace, Name: name}
}

// Claim is one SessionClaim.
type Claim struct {
	c               *Client
	Namespace, Name string
}

// Get reads the claim.
func (cl *Claim) Get(ctx context.Context) (*v1alpha1.SessionClaim, error) {
	var sc v1alpha1.SessionClaim
	err := cl.c.kube.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: cl.Name}, &sc)
	return &sc, err
}

// WaitReady waits until the claim's Ready condition is True, and its
// WorktreeReady too when it asked for a worktree.
func (cl *Claim) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		sc, err := cl.Get(ctx)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		ready := meta.FindStatusCondition(sc.Status.Conditions, v1alpha1.ConditionReady)
		if ready != nil && ready.Status == metav1.ConditionTrue && sc.Spec.Worktree != nil {
			// A claim that asked for a worktree is ready once its worktree is.
			ready = meta.FindStatusCondition(sc.Status.Conditions, v1alpha1.ConditionWorktreeReady)
		}
		if ready != nil && ready.Status == metav1.ConditionTrue {
			return nil
		}
		if time.Now().After(deadline) {
			e := &NotReadyError{Claim: cl.Namespace + "/" + cl.Name, Reason: "NoCondition", Message: "the controller has not reported on the claim"}
			if ready != nil {
				e.Reason, e.Message = ready.Reason, ready.Message
			}
			return e
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Release deletes the claim and waits until it is gone.
func (cl *Claim) Release(ctx context.Context) error {
	sc := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: cl.Namespace, Name: cl.Name}}
	if err := cl.c.kube.Delete(ctx, sc); err != nil {
		return client.IgnoreNotFound(err)
	}
	for {
		if _, err := cl.Get(ctx); apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// target is the configuration reaching the claim's exec API and the base
// URL of its paths (up to /namespaces).
func (cl *Claim) target(ctx context.Context) (*rest.Config, string, error) {
	c := cl.c
	if c.aggregated() {
		cfg := rest.CopyConfig(c.cfg)
		return cfg, strings.TrimRight(cfg.Host, "/") + v1alpha1.SubresourcePrefix, nil
	}
	sc, err := cl.Get(ctx)
	if err != nil {
		return nil, "", err
	}
	if sc.Status.Endpoint == "" {
		return nil, "", fmt.Errorf("SessionClaim %s/%s has no status.endpoint yet", cl.Namespace, cl.Name)
	}
	cfg := &rest.Config{Host: "https://" + sc.Status.Endpoint, Timeout: c.cfg.Timeout}
	// The node's certificate must name the Sandbox's node, whatever
	// address the claim's endpoint gives: a node's controller writes that
	// endpoint, and a taken one could point it at itself. (One machine,
	// or a Sandbox this client may not read: the address is verified.)
	var sb v1alpha1.Sandbox
	if err := c.kube.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: sc.Spec.SandboxName}, &sb); err == nil && sb.Node() != "" {
		cfg.ServerName = sb.Node()
	}
	var cm corev1.ConfigMap
	if err := c.kube.Get(ctx, client.ObjectKey{Namespace: c.opts.SystemNamespace, Name: servingcert.ConfigMapName}, &cm); err == nil {
		cfg.CAData = []byte(cm.Data[servingcert.ConfigMapKey])
	} else {
		cfg.CAData, cfg.CAFile = c.cfg.CAData, c.cfg.CAFile
	}
	switch {
	case c.opts.APIToken != "":
		cfg.BearerToken = c.opts.APIToken
	case len(c.cfg.CertData) > 0 || c.cfg.CertFile != "":
		cfg.CertData, cfg.CertFile, cfg.KeyData, cfg.KeyFile = c.cfg.CertData, c.cfg.CertFile, c.cfg.KeyData, c.cfg.KeyFile
	default:
		return nil, "", errors.New("reaching the exec API on the Sandbox's node needs a client certificate or Options.APIToken; the configuration's token is never sent to a node")
	}
	return cfg, cfg.Host + "/api/" + v1alpha1.GroupVersion.Version, nil
}

func (c *Client) aggregated() bool {
	if c.opts.Via != "" {
		return c.opts.Via == "api-server"
	}
	hc, err := rest.HTTPClientFor(c.cfg)
	if err != nil {
		return false
	}
	resp, err := hc.Get(strings.TrimRight(c.cfg.Host, "/") + v1alpha1.SubresourcePrefix)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (cl *Claim) path(what string) string {
	return "/namespaces/" + url.PathEscape(cl.Namespace) + "/sessionclaims/" + url.PathEscape(cl.Name) + "/" + what
}

// Exec runs one command (argv, never a shell line) with the given streams
// (any may be nil) and returns its exit code. A refusal wraps ErrRefused.
func (cl *Claim) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("argv: give the command and its arguments")
	}
	cfg, base, err := cl.target(ctx)
	if err != nil {
		return 0, err
	}
	q := url.Values{"command": argv}
	q.Set("stdin", fmt.Sprint(stdin != nil))
	q.Set("stdout", "true")
	q.Set("stderr", "true")
	u, err := url.Parse(base + cl.path("exec") + "?" + q.Encode())
	if err != nil {
		return 0, err
	}
	ex, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, u.String())
	if err != nil {
		return 0, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	var exit utilexec.CodeExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		return exit.ExitStatus(), nil
	case strings.HasPrefix(err.Error(), "command refused"):
		return 0, fmt.Errorf("%w: %s", ErrRefused, strings.TrimPrefix(err.Error(), "command refused: "))
	}
	return 0, fmt.Errorf("exec in SessionClaim %s/%s: %w", cl.Namespace, cl.Name, err)
}

// Entry is one entry of a directory: Type is file, dir, symlink or other.
type Entry struct {
	Name    string      `json:"name"`
	Type    string      `json:"type"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
}

func (cl *Claim) files(ctx context.Context, method, sandboxPath string, body io.Reader, query string) (*http.Response, error) {
	parts := strings.Split(strings.Trim(sandboxPath, "/"), "/")
	for i := range parts {
		parts[i] = url.PathEscape(parts[i])
	}
	cfg, base, err := cl.target(ctx)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, base+cl.path("files/"+strings.Join(parts, "/"))+query, body)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var st metav1.Status
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			msg = st.Message
		}
		return nil, fmt.Errorf("%s %s in SessionClaim %s/%s: %s (%d)", method, sandboxPath, cl.Namespace, cl.Name, msg, resp.StatusCode)
	}
	return resp, nil
}

// ReadFile reads a file of the sandbox, at most MaxRead bytes.
func (cl *Claim) ReadFile(ctx context.Context, sandboxPath string) ([]byte, error) {
	resp, err := cl.files(ctx, http.MethodGet, sandboxPath, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// The agent may have put a directory where the file was: its listing
	// is not the file's contents.
	if t := resp.Header.Get(headerEntryType); t != "file" {
		return nil, fmt.Errorf("reading %s: it is a %s, not a regular file", sandboxPath, entryType(t))
	}
	if resp.ContentLength > MaxRead {
		return nil, fmt.Errorf("reading %s: %d bytes is more than the %d ReadFile reads", sandboxPath, resp.ContentLength, MaxRead)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxRead+1))
	if err == nil && len(b) > MaxRead {
		return nil, fmt.Errorf("reading %s: more than the %d bytes ReadFile reads", sandboxPath, MaxRead)
	}
	return b, err
}

// MaxRead is the most ReadFile reads: the file's size is the agent's to
// choose.
const MaxRead = 16 << 20

// MaxList is the most bytes of a directory's listing List reads.
const MaxList = 16 << 20

// headerEntryType is the exec API's header naming what a path is: file,
// dir, symlink and so on.
const headerEntryType = "X-Entry-Type"

func entryType(t string) string {
	if t == "" {
		return "thing the server did not name"
	}
	return t
}

// WriteFile replaces a file of the sandbox atomically.
func (cl *Claim) WriteFile(ctx context.Context, sandboxPath string, data []byte) error {
	resp, err := cl.files(ctx, http.MethodPut, sandboxPath, bytes.NewReader(data), "")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// List lists a directory of the sandbox.
func (cl *Claim) List(ctx context.Context, sandboxPath string) ([]Entry, error) {
	resp, err := cl.files(ctx, http.MethodGet, sandboxPath, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// The agent may have put a file holding a forged listing where the
	// directory was; the listing itself is bounded, and each name is one
	// a directory can hold, so a caller may join it to a local path.
	if t := resp.Header.Get(headerEntryType); t != "dir" {
		return nil, fmt.Errorf("listing %s: it is a %s, not a directory", sandboxPath, entryType(t))
	}
	lr := &io.LimitedReader{R: resp.Body, N: MaxList + 1}
	var out []Entry
	if err := json.NewDecoder(lr).Decode(&out); err != nil {
		if lr.N <= 0 {
			return nil, fmt.Errorf("listing %s: more than the %d bytes of listing List reads", sandboxPath, MaxList)
		}
		return nil, fmt.Errorf("listing %s: %w", sandboxPath, err)
	}
	for _, e := range out {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") {
			return nil, fmt.Errorf("listing %s: the server named an entry %q, which no directory holds", sandboxPath, e.Name)
		}
	}
	return out, nil
}

// Remove removes a file, or a directory tree with recursive.
func (cl *Claim) Remove(ctx context.Context, sandboxPath string, recursive bool) error {
	q := ""
	if recursive {
		q = "?recursive=true"
	}
	resp, err := cl.files(ctx, http.MethodDelete, sandboxPath, nil, q)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
