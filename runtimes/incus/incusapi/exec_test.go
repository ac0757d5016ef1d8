package incusapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // the websocket handshake's accept key is defined with SHA-1
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// rawStreams answers an exec with streams written frame by frame, the
// way incusd writes them, so a test decides exactly what is on the wire
// and when the daemon's end of a stream is gone.
type rawStreams struct {
	t *testing.T
	// stdout and stderr are the frames each output stream carries before
	// the daemon closes it.
	stdout, stderr []byte
	stdoutGone     chan struct{}
}

func (d *rawStreams) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/1.0/instances/box/exec":
		async(w, "ex", map[string]any{"fds": map[string]string{"0": "s0", "1": "s1", "2": "s2", "control": "sc"}})
	case "/1.0/operations/ex/websocket":
		switch r.URL.Query().Get("secret") {
		case "s1":
			conn := d.handshake(w, r)
			_, _ = conn.Write(d.stdout)
			_ = conn.Close()
			close(d.stdoutGone)
		case "s2":
			// Exec reads no stream before every one is connected: stdout
			// is closed by then, whatever the scheduler does.
			select {
			case <-d.stdoutGone:
			case <-time.After(5 * time.Second):
				d.t.Error("stdout was never closed")
			}
			conn := d.handshake(w, r)
			_, _ = conn.Write(d.stderr)
			_ = conn.Close()
		default:
			// stdin and control answer the client's close, as incusd's do.
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				d.t.Errorf("accepting a websocket: %v", err)
				return
			}
			<-ws.CloseRead(context.Background()).Done()
		}
	case "/1.0/operations/ex/wait":
		answer(w, map[string]any{"id": "ex", "status": "Success", "metadata": map[string]any{"return": 0}})
	default:
		fail(w, 404, "not found")
	}
}

// handshake upgrades the request to a websocket by hand and returns the
// raw connection.
func (d *rawStreams) handshake(w http.ResponseWriter, r *http.Request) io.ReadWriteCloser {
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")) //nolint:gosec // see the import
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		d.t.Fatalf("hijacking: %v", err)
	}
	_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n\r\n")
	_ = buf.Flush()
	return struct {
		*bufio.Reader
		io.WriteCloser
	}{buf.Reader, conn}
}

// frame is one unmasked server frame with a short payload.
func frame(opcode byte, payload string) []byte {
	return append([]byte{0x80 | opcode, byte(len(payload))}, payload...)
}

const (
	opText   = 0x1
	opBinary = 0x2
	opPing   = 0x9
)

// incusd pings a stream as soon as it is connected and closes it right
// after its last output. A client that answers the ping by then writes
// to a closed socket: the output queued behind the ping must still be read.
func TestExecOutputBehindAPingIsRead(t *testing.T) {
	d := &rawStreams{t: t, stdoutGone: make(chan struct{}),
		stdout: bytes.Join([][]byte{frame(opPing, "keepalive"), frame(opBinary, "hello\n"), frame(opText, "")}, nil),
		stderr: bytes.Join([][]byte{frame(opPing, "keepalive"), frame(opBinary, "warning\n"), frame(opText, "")}, nil),
	}
	c, _ := fakeDaemon(t, d)
	var out, errb bytes.Buffer
	code, err := c.Exec(context.Background(), "box", ExecRequest{Command: []string{"true"}, Stdout: &out, Stderr: &errb})
	if err != nil || code != 0 || out.String() != "hello\n" || errb.String() != "warning\n" {
		t.Fatalf("code %d err %v stdout %q stderr %q; want 0, no error, hello and warning", code, err, out.String(), errb.String())
	}
}

// A stream that ends before the daemon's barrier lost output: Exec returns
// the exit status and an error, never a quiet success.
func TestExecStreamCutBeforeItsEndIsAnError(t *testing.T) {
	d := &rawStreams{t: t, stdoutGone: make(chan struct{}),
		stdout: frame(opBinary, "hel"),
		stderr: frame(opText, ""),
	}
	c, _ := fakeDaemon(t, d)
	var out bytes.Buffer
	code, err := c.Exec(context.Background(), "box", ExecRequest{Command: []string{"true"}, Stdout: &out})
	if !errors.Is(err, errOutputCut) {
		t.Fatalf("err %v, want one saying the output was cut", err)
	}
	if code != 0 || out.String() != "hel" {
		t.Fatalf("code %d stdout %q; want the exit status and what did arrive", code, out.String())
	}
}
