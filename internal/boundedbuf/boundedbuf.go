// Package boundedbuf keeps the first part of what a process prints and
// counts the rest, so that a chatty or hostile one (git in an agent's
// repository, cp over an agent's files) cannot grow the controller's
// memory. It never makes the process fail: what is dropped is reported
// written.
package boundedbuf

import "strconv"

// Buffer keeps the first Max bytes written to it and counts the rest.
// Like bytes.Buffer it is not safe for concurrent writes; exec.Cmd writes
// to one at a time when it is both Stdout and Stderr.
type Buffer struct {
	Max     int
	buf     []byte
	dropped int64
}

// New is a Buffer keeping at most max bytes.
func New(max int) *Buffer { return &Buffer{Max: max} }

// Write always reports all of p written: a short write would make the
// copier fail and the process see a broken pipe instead of finishing.
func (b *Buffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := max(b.Max-len(b.buf), 0); n > room {
		b.dropped += int64(n - room)
		p = p[:room]
	}
	b.buf = append(b.buf, p...)
	return n, nil
}

// Truncated says whether anything was dropped.
func (b *Buffer) Truncated() bool { return b.dropped > 0 }

// String is what was kept, and how much was dropped after it.
func (b *Buffer) String() string {
	if b.dropped == 0 {
		return string(b.buf)
	}
	return string(b.buf) + "…(" + strconv.FormatInt(b.dropped, 10) + " more bytes dropped)"
}
