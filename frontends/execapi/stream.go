package execapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The remote-command websocket protocol, version 5: every binary message
// starts with its channel number; a message [255, n] closes channel n in
// the sender's direction (the client closes stdin that way).
const protocolV5 = "v5.channel.k8s.io"

const (
	channelStdin  = 0
	channelStdout = 1
	channelStderr = 2
	channelError  = 3
	channelResize = 4
	channelClose  = 255
)

// frameWriteTimeout bounds the wait for one frame to leave: a client that
// takes longer is taken as gone, and its command is killed.
const frameWriteTimeout = time.Minute

var upgrader = websocket.Upgrader{
	Subprotocols:    []string{protocolV5},
	ReadBufferSize:  32 << 10,
	WriteBufferSize: 32 << 10,
}

// wantsV5 says whether the request is a websocket upgrade that offers the
// one protocol version served.
func wantsV5(r *http.Request) bool {
	if !websocket.IsWebSocketUpgrade(r) {
		return false
	}
	for _, p := range websocket.Subprotocols(r) {
		if p == protocolV5 {
			return true
		}
	}
	return false
}

var errStreamClosed = errors.New("the exec stream is closed")

// stream is the server's end of one exec connection. Output frames are
// written as they come, so a command's output is never held here beyond
// one frame, and a slow client slows the command down instead.
type stream struct {
	conn *websocket.Conn
	// cancel ends the command: the client went away or stopped reading.
	cancel context.CancelFunc

	wmu    sync.Mutex
	closed bool

	stdinOnce sync.Once
	stdin     *os.File // write end of the command's stdin pipe; nil without stdin
	readDone  chan struct{}
}

func newStream(conn *websocket.Conn, cancel context.CancelFunc, stdin *os.File) *stream {
	s := &stream{conn: conn, cancel: cancel, stdin: stdin, readDone: make(chan struct{})}
	go s.readLoop()
	return s
}

// readLoop moves stdin frames into the command and answers pings (gorilla
// does while a reader is active). When the connection ends the command's
// context is cancelled, which kills the process.
func (s *stream) readLoop() {
	defer close(s.readDone)
	defer s.closeStdin()
	for {
		typ, r, err := s.conn.NextReader()
		if err != nil {
			s.cancel()
			return
		}
		if typ != websocket.BinaryMessage {
			continue
		}
		var ch [1]byte
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			continue
		}
		switch ch[0] {
		case channelClose:
			if _, err := io.ReadFull(r, ch[:]); err == nil && ch[0] == channelStdin {
				s.closeStdin()
			}
		case channelStdin:
			if s.stdin != nil {
				// A command that stopped reading blocks this copy; it ends
				// when the command exits and its pipe is closed.
				_, _ = io.Copy(s.stdin, r)
			}
		case channelResize:
			// No terminal is ever allocated; sizes have nothing to apply to.
		}
	}
}

func (s *stream) closeStdin() {
	s.stdinOnce.Do(func() {
		if s.stdin != nil {
			s.stdin.Close()
		}
	})
}

// channel is a writer of output frames on one channel.
func (s *stream) channel(ch byte) io.Writer { return channelWriter{s: s, ch: ch} }

type channelWriter struct {
	s  *stream
	ch byte
}

func (w channelWriter) Write(p []byte) (int, error) {
	if err := w.s.writeFrame(w.ch, p); err != nil {
		w.s.cancel()
		return 0, err
	}
	return len(p), nil
}

func (s *stream) writeFrame(ch byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closed {
		return errStreamClosed
	}
	_ = s.conn.SetWriteDeadline(time.Now().Add(frameWriteTimeout))
	fw, err := s.conn.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	if _, err := fw.Write([]byte{ch}); err != nil {
		return err
	}
	if _, err := fw.Write(p); err != nil {
		return err
	}
	return fw.Close()
}

// finish sends the command's status on the error channel, closes the
// connection normally and waits for the reader to end.
func (s *stream) finish(st metav1.Status) {
	if b, err := json.Marshal(st); err == nil {
		_ = s.writeFrame(channelError, b)
	}
	s.wmu.Lock()
	s.closed = true
	_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(5*time.Second))
	s.wmu.Unlock()
	s.conn.Close()
	<-s.readDone
}
