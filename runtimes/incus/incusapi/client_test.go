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
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// fakeDaemon serves handler on a unix socket, as incusd does.
func fakeDaemon(t *testing.T, handler http.Handler) (*Client, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "unix.socket")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listening on %s: %v", sock, err)
	}
	srv := httptest.NewUnstartedServer(handler)
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	c := New(sock, Options{RequestTimeout: 2 * time.Second, WaitTimeout: 3 * time.Second})
	t.Cleanup(c.Close)
	return c, sock
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func answer(w http.ResponseWriter, meta any) {
	writeJSON(w, 200, map[string]any{"type": "sync", "status": "Success", "status_code": 200, "metadata": meta})
}

func fail(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"type": "error", "error_code": code, "error": msg})
}

func async(w http.ResponseWriter, id string, meta any) {
	writeJSON(w, 202, map[string]any{"type": "async", "status": "Operation created", "status_code": 100,
		"operation": "/1.0/operations/" + id,
		"metadata":  map[string]any{"id": id, "status": "Running", "status_code": 103, "metadata": meta}})
}

func TestErrorBodies(t *testing.T) {
	tests := []struct {
		name      string
		handler   http.HandlerFunc
		wantCode  int
		wantMsg   string
		notFound  bool
		conflict  bool
		staleETag bool
	}{
		{
			name:     "error envelope keeps the daemon's message and code",
			handler:  func(w http.ResponseWriter, _ *http.Request) { fail(w, 404, "Instance not found") },
			wantCode: 404, wantMsg: "Instance not found", notFound: true,
		},
		{
			name:     "conflict",
			handler:  func(w http.ResponseWriter, _ *http.Request) { fail(w, 409, "Instance \"x\" already exists") },
			wantCode: 409, wantMsg: "already exists", conflict: true,
		},
		{
			name:     "etag mismatch",
			handler:  func(w http.ResponseWriter, _ *http.Request) { fail(w, 412, "ETag doesn't match") },
			wantCode: 412, wantMsg: "ETag", staleETag: true,
		},
		{
			name: "a body that is not JSON still gives the HTTP status",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusBadGateway)
				_, _ = io.WriteString(w, "<html>bad gateway</html>")
			},
			wantCode: 502, wantMsg: "Bad Gateway",
		},
		{
			name: "an error type with a 200 status is still an error",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				writeJSON(w, 200, map[string]any{"type": "error", "error_code": 500, "error": "boom"})
			},
			wantCode: 500, wantMsg: "boom",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := fakeDaemon(t, tt.handler)
			_, _, err := c.GetInstance(context.Background(), "x")
			var se *StatusError
			if !errors.As(err, &se) {
				t.Fatalf("want a *StatusError, got %T: %v", err, err)
			}
			if se.Code != tt.wantCode || !strings.Contains(se.Message, tt.wantMsg) {
				t.Fatalf("got code %d message %q; want %d containing %q", se.Code, se.Message, tt.wantCode, tt.wantMsg)
			}
			if IsNotFound(err) != tt.notFound || IsConflict(err) != tt.conflict || hasCode(err, http.StatusPreconditionFailed) != tt.staleETag {
				t.Fatalf("classification wrong for %v", err)
			}
			if IsUnavailable(err) {
				t.Fatalf("an answer from the daemon is not unavailability: %v", err)
			}
			if !strings.Contains(err.Error(), "/1.0/instances/x") {
				t.Fatalf("error should name the request: %v", err)
			}
		})
	}
}

func TestUnavailableNamesTheSocket(t *testing.T) {
	dir := t.TempDir()
	unreadable := filepath.Join(dir, "closed.socket")
	l, err := net.Listen("unix", unreadable)
	if err != nil {
		t.Fatal(err)
	}
	// A socket file nobody listens on any more: connection refused.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	notASocket := filepath.Join(dir, "plain-file")
	if err := os.WriteFile(notASocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sock := range []string{filepath.Join(dir, "missing.socket"), unreadable, notASocket} {
		t.Run(filepath.Base(sock), func(t *testing.T) {
			c := New(sock, Options{DialTimeout: 200 * time.Millisecond})
			_, err := c.Server(context.Background())
			if !IsUnavailable(err) {
				t.Fatalf("want *UnavailableError, got %T: %v", err, err)
			}
			if !strings.Contains(err.Error(), sock) {
				t.Fatalf("error should name the socket %s: %v", sock, err)
			}
		})
	}
}

func TestProjectIsSentOnEveryRequest(t *testing.T) {
	var got atomic.Value
	c, _ := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.URL.Query().Get("project"))
		answer(w, map[string]any{"name": "x", "status": "Running"})
	}))
	ctx := context.Background()
	if _, _, err := c.GetInstance(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if p := got.Load().(string); p != "" {
		t.Fatalf("default client sent project %q", p)
	}
	if _, _, err := c.InProject("agents").GetInstance(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if p := got.Load().(string); p != "agents" {
		t.Fatalf("project client sent project %q, want agents", p)
	}
}

func TestETagRoundTrip(t *testing.T) {
	c, _ := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("ETag", `"v1"`)
			answer(w, map[string]any{"name": "x", "config": map[string]string{"a": "b"}})
		case http.MethodPut:
			if r.Header.Get("If-Match") != `"v1"` {
				fail(w, 412, "ETag doesn't match")
				return
			}
			answer(w, nil)
		}
	}))
	ctx := context.Background()
	inst, etag, err := c.GetInstance(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateInstance(ctx, "x", inst.Writable(), etag); err != nil {
		t.Fatalf("update with the read ETag: %v", err)
	}
	if err := c.UpdateInstance(ctx, "x", inst.Writable(), `"stale"`); !hasCode(err, http.StatusPreconditionFailed) {
		t.Fatalf("update with a stale ETag: want 412, got %v", err)
	}
}

func TestOperations(t *testing.T) {
	tests := []struct {
		name string
		// waits answers successive /wait calls.
		waits   []func(w http.ResponseWriter)
		wantErr string
		opErr   bool
	}{
		{
			name: "success after the daemon's wait timed out once",
			waits: []func(http.ResponseWriter){
				func(w http.ResponseWriter) { answer(w, map[string]any{"id": "op", "status": "Running"}) },
				func(w http.ResponseWriter) { answer(w, map[string]any{"id": "op", "status": "Success"}) },
			},
		},
		{
			name: "a failed operation carries its error",
			waits: []func(http.ResponseWriter){
				func(w http.ResponseWriter) {
					answer(w, map[string]any{"id": "op", "status": "Failure", "description": "Creating instance", "err": "Image not provided for instance creation"})
				},
			},
			wantErr: "creating instance: Image not provided", opErr: true,
		},
		{
			name: "the wait itself answered with an error envelope",
			waits: []func(http.ResponseWriter){
				func(w http.ResponseWriter) { fail(w, 404, "Operation not found") },
			},
			wantErr: "Operation not found",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int32
			c, _ := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodPost && r.URL.Path == "/1.0/instances":
					async(w, "op", nil)
				case r.URL.Path == "/1.0/operations/op/wait":
					if r.URL.Query().Get("timeout") == "" {
						t.Errorf("wait without a server-side timeout")
					}
					i := int(n.Add(1)) - 1
					if i >= len(tt.waits) {
						i = len(tt.waits) - 1
					}
					tt.waits[i](w)
				default:
					fail(w, 404, "not found")
				}
			}))
			err := c.CreateInstance(context.Background(), InstancesPost{Name: "x", Source: InstanceSource{Type: "image", Alias: "a"}})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			var oe *OperationError
			if errors.As(err, &oe) != tt.opErr {
				t.Fatalf("OperationError: got %v, want %v (%v)", !tt.opErr, tt.opErr, err)
			}
			if !strings.Contains(err.Error(), "creating instance x") {
				t.Fatalf("error should say what was done to what: %v", err)
			}
		})
	}
}

func TestWaitTimesOut(t *testing.T) {
	c, _ := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The daemon never finishes; each wait returns after a short while.
		time.Sleep(50 * time.Millisecond)
		answer(w, map[string]any{"id": "op", "status": "Running", "description": "Starting instance"})
	}))
	c.opts.WaitTimeout = 300 * time.Millisecond
	start := time.Now()
	_, err := c.Wait(context.Background(), "/1.0/operations/op")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("wait took %s, past its timeout", d)
	}
}

func TestRequestTimeout(t *testing.T) {
	release := make(chan struct{})
	c, _ := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer close(release)
	c.opts.RequestTimeout = 200 * time.Millisecond
	_, _, err := c.GetInstance(context.Background(), "x")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
	if IsUnavailable(err) {
		t.Fatalf("a slow answer is not an unreachable daemon: %v", err)
	}
}

func TestFilePushSendsOctetStream(t *testing.T) {
	var got struct {
		ctype, uid, gid, mode, typ, path string
		body                             []byte
	}
	c, _ := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
			got.ctype = r.Header.Get("Content-Type")
			got.uid, got.gid = r.Header.Get("X-Incus-Uid"), r.Header.Get("X-Incus-Gid")
			got.mode, got.typ = r.Header.Get("X-Incus-Mode"), r.Header.Get("X-Incus-Type")
			got.path = r.URL.Query().Get("path")
			got.body, _ = io.ReadAll(r.Body)
			answer(w, nil)
		case http.MethodGet:
			w.Header().Set("X-Incus-Type", "file")
			w.Header().Set("X-Incus-Uid", "0")
			w.Header().Set("X-Incus-Gid", "42")
			w.Header().Set("X-Incus-Mode", "0640")
			_, _ = io.WriteString(w, "root:!:::::::\n")
		}
	}))
	ctx := context.Background()
	if err := c.WriteFile(ctx, "x", "/etc/passwd", []byte("line\n"), 0, 0, 0o644); err != nil {
		t.Fatal(err)
	}
	if got.ctype != "application/octet-stream" || got.typ != "file" || got.mode != "0644" || got.uid != "0" || got.path != "/etc/passwd" || string(got.body) != "line\n" {
		t.Fatalf("push sent %+v", got)
	}
	data, info, err := c.ReadFile(ctx, "x", "/etc/shadow")
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != "root:!:::::::\n" || info.GID != 42 || info.Mode != 0o640 {
		t.Fatalf("read %q %+v", data, info)
	}
}

// execDaemon answers an exec request the way incusd does: an operation
// with one websocket secret per stream, the command "running" once every
// stream is connected, its return code in the finished operation.
type execDaemon struct {
	t *testing.T
	// gone is how many stream connections answer goneCode (404 when
	// zero) before the others are accepted.
	gone atomic.Int32
	// goneAttempts is how many exec requests have every stream answered
	// goneCode.
	goneAttempts atomic.Int32
	goneCode     int
	posts        atomic.Int32
	run          func(stdin []byte, stdout, stderr *websocket.Conn, control *websocket.Conn) int
	gotExec      execPost
	finished     chan int
}

func (d *execDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/1.0/instances/box/exec":
		d.posts.Add(1)
		_ = json.NewDecoder(r.Body).Decode(&d.gotExec)
		async(w, "ex", map[string]any{"fds": map[string]string{"0": "s0", "1": "s1", "2": "s2", "control": "sc"}})
	case r.URL.Path == "/1.0/operations/ex/websocket":
		if d.posts.Load() <= d.goneAttempts.Load() || d.gone.Add(-1) >= 0 {
			if d.goneCode == 0 {
				fail(w, 404, "Operation not found")
			} else {
				fail(w, d.goneCode, "Only running operations can be connected")
			}
			return
		}
		d.accept(w, r)
	case r.URL.Path == "/1.0/operations/ex/wait":
		select {
		case code := <-d.finished:
			answer(w, map[string]any{"id": "ex", "status": "Success", "metadata": map[string]any{"return": code}})
		case <-time.After(time.Second):
			answer(w, map[string]any{"id": "ex", "status": "Running"})
		}
	default:
		fail(w, 404, "not found")
	}
}

func (d *execDaemon) accept(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		d.t.Errorf("accepting a websocket: %v", err)
		return
	}
	secret := r.URL.Query().Get("secret")
	streams <- stream{secret, ws}
	<-r.Context().Done()
}

type stream struct {
	secret string
	ws     *websocket.Conn
}

var streams chan stream

func (d *execDaemon) serve() {
	got := map[string]*websocket.Conn{}
	for len(got) < 4 {
		s := <-streams
		got[s.secret] = s.ws
	}
	var stdin bytes.Buffer
	for {
		_, data, err := got["s0"].Read(context.Background())
		if err != nil {
			break
		}
		stdin.Write(data)
	}
	code := d.run(stdin.Bytes(), got["s1"], got["s2"], got["sc"])
	// As incusd ends an output stream: its barrier, an empty text
	// message, and then the connection goes.
	for _, fd := range []string{"s1", "s2"} {
		_ = got[fd].Write(context.Background(), websocket.MessageText, nil)
		_ = got[fd].CloseNow()
	}
	d.finished <- code
}

func TestExecStreams(t *testing.T) {
	streams = make(chan stream, 4)
	d := &execDaemon{t: t, finished: make(chan int, 1), run: func(stdin []byte, stdout, stderr, _ *websocket.Conn) int {
		ctx := context.Background()
		_ = stdout.Write(ctx, websocket.MessageBinary, bytes.ToUpper(stdin))
		_ = stderr.Write(ctx, websocket.MessageBinary, []byte("warning\n"))
		return 3
	}}
	c, _ := fakeDaemon(t, d)
	go d.serve()
	var out, errb bytes.Buffer
	code, err := c.Exec(context.Background(), "box", ExecRequest{
		Command: []string{"tr", "a-z", "A-Z"}, Env: map[string]string{"HOME": "/workspace"},
		User: 1000, Group: 1000, Cwd: "/workspace",
		Stdin: strings.NewReader("hello\n"), Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 || out.String() != "HELLO\n" || errb.String() != "warning\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out.String(), errb.String())
	}
	g := d.gotExec
	if !g.WaitForWebsocket || g.Interactive || g.User != 1000 || g.Group != 1000 || g.Cwd != "/workspace" || g.Environment["HOME"] != "/workspace" {
		t.Fatalf("exec request %+v", g)
	}
}

func TestExecCancelSendsKill(t *testing.T) {
	streams = make(chan stream, 4)
	gotSignal := make(chan string, 1)
	d := &execDaemon{t: t, finished: make(chan int, 1), run: func(_ []byte, _, _, control *websocket.Conn) int {
		_, msg, err := control.Read(context.Background())
		if err != nil {
			gotSignal <- fmt.Sprintf("control read: %v", err)
			return -1
		}
		gotSignal <- string(msg)
		return 137
	}}
	c, _ := fakeDaemon(t, d)
	go d.serve()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, "box", ExecRequest{Command: []string{"sleep", "100"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the context's error, got %v", err)
	}
	var ctl execControl
	msg := <-gotSignal
	if err := json.Unmarshal([]byte(msg), &ctl); err != nil || ctl.Command != "signal" || ctl.Signal != 9 {
		t.Fatalf("control message %q, want a SIGKILL signal", msg)
	}
}

func TestExecAsksAgainWhenTheOperationWasGone(t *testing.T) {
	for _, code := range []int{404, 500} {
		t.Run(strconv.Itoa(code), func(t *testing.T) { execAsksAgain(t, code) })
	}
}

// A loaded daemon dropped the operation three times in a row: Exec keeps
// asking, with pauses, a bounded number of times.
func TestExecAsksAgainAfterSeveralDroppedOperations(t *testing.T) {
	streams = make(chan stream, 4)
	d := &execDaemon{t: t, finished: make(chan int, 1), goneCode: 404, run: func(_ []byte, stdout, _, _ *websocket.Conn) int {
		_ = stdout.Write(context.Background(), websocket.MessageBinary, []byte("ran"))
		return 0
	}}
	d.goneAttempts.Store(4)
	c, _ := fakeDaemon(t, d)
	go d.serve()
	var out bytes.Buffer
	code, err := c.Exec(context.Background(), "box", ExecRequest{Command: []string{"true"}, Stdout: &out})
	if err != nil || code != 0 || out.String() != "ran" {
		t.Fatalf("code %d err %v out %q", code, err, out.String())
	}
	if n := d.posts.Load(); n != 5 {
		t.Fatalf("exec was asked for %d times, want 5", n)
	}
}

// execAsksAgain: the first stream connection is answered with code, as
// when the operation ended before its streams were connected.
func execAsksAgain(t *testing.T, goneCode int) {
	streams = make(chan stream, 4)
	d := &execDaemon{t: t, finished: make(chan int, 1), goneCode: goneCode, run: func(stdin []byte, stdout, _, _ *websocket.Conn) int {
		_ = stdout.Write(context.Background(), websocket.MessageBinary, stdin)
		return 0
	}}
	d.gone.Store(1)
	c, _ := fakeDaemon(t, d)
	go d.serve()
	var out bytes.Buffer
	code, err := c.Exec(context.Background(), "box", ExecRequest{Command: []string{"cat"}, Stdin: strings.NewReader("all of it"), Stdout: &out})
	if err != nil || code != 0 {
		t.Fatalf("code %d err %v", code, err)
	}
	if out.String() != "all of it" {
		t.Fatalf("stdin was consumed by the failed attempt: got %q", out.String())
	}
	if n := d.posts.Load(); n != 2 {
		t.Fatalf("exec was asked for %d times, want 2", n)
	}
}
