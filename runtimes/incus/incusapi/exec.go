package incusapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// ExecRequest is one command to run in an instance. Command is passed as
// separate arguments; the daemon runs it without a shell.
type ExecRequest struct {
	Command []string
	// Env is the complete environment of the command.
	Env map[string]string
	// User and Group are the ids, inside the instance, it runs as.
	User  uint32
	Group uint32
	// Cwd is its working directory inside the instance.
	Cwd    string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

type execPost struct {
	Command          []string          `json:"command"`
	Environment      map[string]string `json:"environment"`
	WaitForWebsocket bool              `json:"wait-for-websocket"`
	RecordOutput     bool              `json:"record-output"`
	Interactive      bool              `json:"interactive"`
	User             uint32            `json:"user"`
	Group            uint32            `json:"group"`
	Cwd              string            `json:"cwd,omitempty"`
}

type execControl struct {
	Command string `json:"command"`
	Signal  int    `json:"signal,omitempty"`
}

// KillGrace bounds how long Exec waits for the daemon to report a command
// it was told to kill because the caller's context ended.
const KillGrace = 10 * time.Second

// streamDrain bounds how long Exec waits, once the command has ended, for
// the rest of its output to arrive.
const streamDrain = 5 * time.Second

// streamDialTimeout bounds connecting one exec stream.
const streamDialTimeout = 10 * time.Second

// execAttempts bounds how often Exec asks again for an exec whose streams
// the daemon no longer knew when they were connected, execRetryPause is
// the pause before the first new attempt, doubled before each next one:
// three attempts in a row failed on a loaded machine.
const (
	execAttempts   = 6
	execRetryPause = 100 * time.Millisecond
)

// errStreamGone is a stream the daemon answered 404 or 500 for: the
// operation ended before every stream was connected, so its command never
// started.
var errStreamGone = errors.New("the exec operation was gone before its streams were connected")

// Exec runs a command in an instance, streaming stdin, stdout and stderr
// over websockets, and returns its exit status. When ctx ends first, the
// command is sent SIGKILL and Exec returns ctx's error.
//
// The daemon starts the command only once every stream is connected; on a
// loaded machine it sometimes drops the operation before that (a stream
// answers 404). Nothing ran and no stdin was read then, so the exec is
// asked for again, a bounded number of times.
func (c *Client) Exec(ctx context.Context, name string, req ExecRequest) (int, error) {
	var code int
	var err error
	pause := execRetryPause
	for attempt := range execAttempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return code, err
			case <-time.After(pause):
			}
			pause *= 2
		}
		code, err = c.execOnce(ctx, name, req)
		if !errors.Is(err, errStreamGone) || ctx.Err() != nil {
			break
		}
	}
	return code, err
}

func (c *Client) execOnce(ctx context.Context, name string, req ExecRequest) (int, error) {
	fail := func(err error) (int, error) {
		return -1, fmt.Errorf("running %q in instance %s: %w", req.Command, name, err)
	}
	env := req.Env
	if env == nil {
		env = map[string]string{}
	}
	res, err := c.do(ctx, request{method: http.MethodPost, path: instancePath(name) + "/exec", body: execPost{
		Command:          req.Command,
		Environment:      env,
		WaitForWebsocket: true,
		User:             req.User,
		Group:            req.Group,
		Cwd:              req.Cwd,
	}}, nil)
	if err != nil {
		return fail(err)
	}
	if !res.Async {
		return fail(errors.New("the daemon did not start an operation"))
	}
	var op Operation
	if err := json.Unmarshal(res.Metadata, &op); err != nil {
		return fail(fmt.Errorf("decoding the exec operation: %w", err))
	}
	secrets, err := op.secrets()
	if err != nil {
		return fail(err)
	}

	// The daemon starts the command once every stream is connected, so
	// nothing of its output can be missed.
	conns := map[string]*websocket.Conn{}
	closeAll := func() {
		for _, ws := range conns {
			_ = ws.CloseNow()
		}
	}
	for _, fd := range []string{"control", "0", "1", "2"} {
		secret, ok := secrets[fd]
		if !ok {
			closeAll()
			return fail(fmt.Errorf("the exec operation has no %q stream", fd))
		}
		ws, err := c.dialOperation(ctx, res.Operation, secret)
		if err != nil {
			closeAll()
			_ = c.Cancel(context.WithoutCancel(ctx), res.Operation)
			return fail(err)
		}
		ws.SetReadLimit(-1)
		conns[fd] = ws
	}
	defer closeAll()
	// Nothing is read from these two; CloseRead answers the daemon's
	// pings and close frames on them.
	ctrlCtx := conns["control"].CloseRead(context.WithoutCancel(ctx))
	_ = conns["0"].CloseRead(context.WithoutCancel(ctx))

	go feed(context.WithoutCancel(ctx), conns["0"], req.Stdin)
	var wg sync.WaitGroup
	streamErrs := make([]error, 2)
	for i, s := range []struct {
		ws *websocket.Conn
		w  io.Writer
	}{{conns["1"], req.Stdout}, {conns["2"], req.Stderr}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streamErrs[i] = drain(s.ws, s.w)
		}()
	}

	type waited struct {
		op  *Operation
		err error
	}
	done := make(chan waited, 1)
	go func() {
		o, err := c.Wait(context.WithoutCancel(ctx), res.Operation)
		done <- waited{o, err}
	}()

	var w waited
	var cancelled error
	select {
	case w = <-done:
	case <-ctx.Done():
		cancelled = ctx.Err()
		kill, _ := json.Marshal(execControl{Command: "signal", Signal: 9})
		sendCtx, cancel := context.WithTimeout(ctrlCtx, time.Second)
		_ = conns["control"].Write(sendCtx, websocket.MessageText, kill)
		cancel()
		select {
		case w = <-done:
		case <-time.After(KillGrace):
			return fail(fmt.Errorf("%w; the command did not end within %s of SIGKILL", cancelled, KillGrace))
		}
	}

	streamsDone := make(chan struct{})
	go func() { wg.Wait(); close(streamsDone) }()
	select {
	case <-streamsDone:
	case <-time.After(streamDrain):
		closeAll()
		<-streamsDone
	}

	if cancelled != nil {
		return fail(cancelled)
	}
	if w.err != nil {
		return fail(w.err)
	}
	code, ok := w.op.returnCode()
	if !ok {
		return fail(errors.New("the exec operation ended without an exit status"))
	}
	for i, e := range streamErrs {
		if e != nil {
			return code, fmt.Errorf("running %q in instance %s: streaming fd %d: %w", req.Command, name, i+1, e)
		}
	}
	return code, nil
}

func (c *Client) dialOperation(ctx context.Context, opPath, secret string) (*websocket.Conn, error) {
	u := "ws://incus" + trimAPI(opPath) + "/websocket?" + url.Values{"secret": {secret}}.Encode()
	dctx, cancel := context.WithTimeout(ctx, min(c.opts.RequestTimeout, streamDialTimeout))
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{
		HTTPClient: c.http, CompressionMode: websocket.CompressionDisabled,
		// incusd pings every stream from the moment it is connected and
		// never asks for the pong. Answering would write on a stream the
		// daemon may have closed already, and a pong that fails to send
		// ends the read: the output queued behind the ping was lost.
		OnPingReceived: func(context.Context, []byte) bool { return false },
	})
	if resp != nil && resp.Body != nil && err != nil {
		_ = resp.Body.Close()
	}
	if err != nil && resp != nil && (resp.StatusCode == http.StatusNotFound || resp.StatusCode >= http.StatusInternalServerError) {
		// The operation is gone, or no longer running (the daemon answers
		// 500 for that): it ended before every stream was connected, so its
		// command never started.
		return nil, fmt.Errorf("connecting an exec stream: %s: %w", resp.Status, errStreamGone)
	}
	if err != nil && dctx.Err() != nil && ctx.Err() == nil {
		// A handshake the daemon leaves unanswered (seen on a loaded
		// machine): the command has not started, so the exec is dropped
		// and asked for again like one whose stream is gone.
		return nil, fmt.Errorf("connecting an exec stream: no answer within %s: %w", streamDialTimeout, errStreamGone)
	}
	if err != nil {
		if isDialError(err) {
			return nil, &UnavailableError{Socket: c.socket, Err: fmt.Errorf("connecting an exec stream: %w", err)}
		}
		return nil, fmt.Errorf("connecting an exec stream: %w", err)
	}
	return ws, nil
}

// feed copies r to the command's stdin and then closes it, which the
// command reads as end of file. A nil r is an empty stdin.
func feed(ctx context.Context, ws *websocket.Conn, r io.Reader) {
	if r != nil {
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if werr := ws.Write(ctx, websocket.MessageBinary, buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				break
			}
		}
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
}

// drain copies every message of a stream to w until incusd's end of the
// stream: an empty text message, its barrier, sent once the command's
// output is all written. A writer that fails is dropped and its error
// returned; the stream is still read so the command never blocks on a full
// pipe. A stream that ends without the barrier (the daemon went away, or
// Exec stopped waiting for it) lost output, and says so: a caller that
// decides by what a command printed must never take a cut stream for a
// quiet one.
func drain(ws *websocket.Conn, w io.Writer) error {
	out := &failOnce{w: w}
	for {
		typ, r, err := ws.Reader(context.Background())
		if err != nil {
			if out.err != nil {
				return out.err
			}
			return fmt.Errorf("%w: %w", errOutputCut, err)
		}
		if typ == websocket.MessageText {
			return out.err
		}
		if _, err := io.Copy(out, r); err != nil {
			if out.err != nil {
				return out.err
			}
			return fmt.Errorf("%w: %w", errOutputCut, err)
		}
	}
}

// errOutputCut is a stream that ended before incusd marked its end.
var errOutputCut = errors.New("the output stream ended before the daemon marked its end, so some of the command's output may be missing")

// failOnce writes to w until a write fails, and then discards, keeping
// the error: a read error of the stream is never mistaken for it.
type failOnce struct {
	w   io.Writer
	err error
}

func (f *failOnce) Write(p []byte) (int, error) {
	if f.w != nil && f.err == nil {
		if _, err := f.w.Write(p); err != nil {
			f.err = fmt.Errorf("writing the output: %w", err)
		}
	}
	return len(p), nil
}
