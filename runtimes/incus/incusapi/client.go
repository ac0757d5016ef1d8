// Package incusapi is a small client of the Incus REST API over the
// daemon's unix socket: the request envelope and its errors, background
// operations and their waits, instances, files, images, storage and
// streaming exec over websockets. It holds only what the incus driver uses.
//
// It must never hide which socket it talks to: every failure to reach the
// daemon is an *UnavailableError naming the socket path, so that callers can
// tell "the daemon is down or unreadable" from "the daemon said no".
package incusapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultSocket is where incusd listens when INCUS_DIR and INCUS_SOCKET
// are unset.
const DefaultSocket = "/var/lib/incus/unix.socket"

// Defaults of Options.
const (
	DefaultDialTimeout    = 2 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	DefaultWaitTimeout    = 5 * time.Minute
)

// Options tune a Client; the zero value takes the defaults.
type Options struct {
	// DialTimeout bounds connecting to the socket.
	DialTimeout time.Duration
	// RequestTimeout bounds one synchronous request, unless the caller's
	// context ends sooner. Streams (exec, file transfers) are bounded by
	// the caller's context alone.
	RequestTimeout time.Duration
	// WaitTimeout bounds waiting for one background operation.
	WaitTimeout time.Duration
}

// Client talks to one incusd. Its methods are safe for concurrent use.
type Client struct {
	socket  string
	project string
	opts    Options
	http    *http.Client
}

// New returns a client of the daemon listening on socket. It does not
// connect: a daemon that is down is reported by each call.
func New(socket string, opts Options) *Client {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = DefaultWaitTimeout
	}
	dialer := &net.Dialer{Timeout: opts.DialTimeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		// The daemon speaks plain HTTP/1.1 on its socket.
		ForceAttemptHTTP2: false,
	}
	return &Client{socket: socket, opts: opts, http: &http.Client{Transport: tr}}
}

// Socket is the path of the daemon's socket.
func (c *Client) Socket() string { return c.socket }

// Project is the project requests are made in; empty means the daemon's
// default project.
func (c *Client) Project() string { return c.project }

// InProject returns a client that makes its requests in project (empty:
// the daemon's default). It shares the connection pool.
func (c *Client) InProject(project string) *Client {
	cp := *c
	cp.project = project
	return &cp
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// UnavailableError is a failure to reach the daemon at all: the socket is
// missing, unreadable, or nothing answers on it.
type UnavailableError struct {
	Socket string
	Err    error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("incus socket %s: %v", e.Socket, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// StatusError is a request the daemon answered with an error.
type StatusError struct {
	Method string
	Path   string
	// Code is the error_code of the answer (an HTTP status).
	Code int
	// Message is the daemon's error text.
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: incus answered %d: %s", e.Method, e.Path, e.Code, e.Message)
}

// IsNotFound says whether err is the daemon answering 404.
func IsNotFound(err error) bool { return hasCode(err, http.StatusNotFound) }

// IsConflict says whether err is the daemon answering 409 (already exists).
func IsConflict(err error) bool { return hasCode(err, http.StatusConflict) }

func hasCode(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

// IsUnavailable says whether err means the daemon could not be reached.
func IsUnavailable(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue)
}

// response is the envelope of every answer.
type response struct {
	Type       string          `json:"type"`
	Status     string          `json:"status"`
	StatusCode int             `json:"status_code"`
	Operation  string          `json:"operation"`
	ErrorCode  int             `json:"error_code"`
	Error      string          `json:"error"`
	Metadata   json.RawMessage `json:"metadata"`
}

// Response is a successful answer: sync with its metadata, or async with
// the operation it started.
type Response struct {
	// Async is set when the daemon started a background operation.
	Async bool
	// Operation is the operation's path, for async answers.
	Operation string
	// Metadata is the answer's metadata (for async: the operation).
	Metadata json.RawMessage
	// ETag is the object's version, for If-Match on a later update.
	ETag string
}

// request is one call: method, path below /1.0, query and JSON body.
type request struct {
	method string
	path   string
	query  url.Values
	body   any
	etag   string
	// raw, when set, is sent as the body with contentType.
	raw         io.Reader
	contentType string
	header      http.Header
	// stream leaves the request bounded by the caller's context only.
	stream bool
}

func (c *Client) url(path string, query url.Values) string {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	if c.project != "" && q.Get("project") == "" {
		q.Set("project", c.project)
	}
	u := "http://incus" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// send performs a request and returns the raw HTTP answer; the caller
// closes its body.
func (c *Client) send(ctx context.Context, r request) (*http.Response, context.CancelFunc, error) {
	cancel := context.CancelFunc(func() {})
	if !r.stream {
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
	}
	var body io.Reader
	contentType := r.contentType
	switch {
	case r.raw != nil:
		body = r.raw
	case r.body != nil:
		b, err := json.Marshal(r.body)
		if err != nil {
			cancel()
			return nil, nil, fmt.Errorf("%s %s: encoding the request: %w", r.method, r.path, err)
		}
		body = bytes.NewReader(b)
		contentType = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, c.url(r.path, r.query), body)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if r.etag != "" {
		req.Header.Set("If-Match", r.etag)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		if ctx.Err() != nil && !isDialError(err) {
			return nil, nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
		}
		return nil, nil, &UnavailableError{Socket: c.socket, Err: fmt.Errorf("%s %s: %w", r.method, r.path, err)}
	}
	return resp, cancel, nil
}

// isDialError says whether err happened while connecting, which is the
// daemon's absence rather than a slow answer.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// do performs a request and decodes the envelope. Metadata of a sync
// answer is decoded into out when out is not nil.
func (c *Client) do(ctx context.Context, r request, out any) (*Response, error) {
	resp, cancel, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer resp.Body.Close()
	return decode(r, resp, out)
}

func decode(r request, resp *http.Response, out any) (*Response, error) {
	var env response
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&env); err != nil {
		if resp.StatusCode >= 400 {
			return nil, &StatusError{Method: r.method, Path: r.path, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
		}
		return nil, fmt.Errorf("%s %s: decoding the answer (HTTP %d): %w", r.method, r.path, resp.StatusCode, err)
	}
	if env.Type == "error" || resp.StatusCode >= 400 {
		code := env.ErrorCode
		if code == 0 {
			code = resp.StatusCode
		}
		msg := env.Error
		if msg == "" {
			msg = http.StatusText(code)
		}
		return nil, &StatusError{Method: r.method, Path: r.path, Code: code, Message: msg}
	}
	res := &Response{Async: env.Type == "async", Operation: env.Operation, Metadata: env.Metadata, ETag: resp.Header.Get("ETag")}
	if out != nil && !res.Async && len(env.Metadata) > 0 && string(env.Metadata) != "null" {
		if err := json.Unmarshal(env.Metadata, out); err != nil {
			return nil, fmt.Errorf("%s %s: decoding the metadata: %w", r.method, r.path, err)
		}
	}
	return res, nil
}

// Get reads path (below the API root, e.g. /1.0/instances/x) into out.
func (c *Client) Get(ctx context.Context, path string, query url.Values, out any) (*Response, error) {
	return c.do(ctx, request{method: http.MethodGet, path: path, query: query}, out)
}

// Run sends a request that may start a background operation and waits for
// it: the result is the finished operation, or nil for a sync answer.
func (c *Client) Run(ctx context.Context, method, path string, query url.Values, body any, etag string) (*Operation, error) {
	res, err := c.do(ctx, request{method: method, path: path, query: query, body: body, etag: etag}, nil)
	if err != nil {
		return nil, err
	}
	if !res.Async {
		return nil, nil
	}
	return c.Wait(ctx, res.Operation)
}

// Server is what GET /1.0 says of the daemon.
type Server struct {
	APIExtensions []string `json:"api_extensions"`
	APIVersion    string   `json:"api_version"`
	Auth          string   `json:"auth"`
	Environment   struct {
		Project       string `json:"project"`
		ServerVersion string `json:"server_version"`
		Driver        string `json:"driver"`
	} `json:"environment"`
}

// Server reads the daemon's description; a cheap call to see whether it
// answers.
func (c *Client) Server(ctx context.Context) (Server, error) {
	var s Server
	_, err := c.Get(ctx, "/1.0", nil, &s)
	return s, err
}

// HasExtension says whether the server lists the API extension.
func (s Server) HasExtension(name string) bool {
	for _, e := range s.APIExtensions {
		if e == name {
			return true
		}
	}
	return false
}

func escape(name string) string { return url.PathEscape(name) }

// trimAPI turns an operation URL into its path, whatever query it carries.
func trimAPI(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i]
	}
	return u
}
