package runtimes

import (
	"bytes"
	"io"
	"sync"
	"testing"
)

// uncomparable has a slice field: comparing two of them through io.Writer
// panics, which OutputWriters must survive.
type uncomparable struct{ parts []string } //nolint:unused // the slice makes it uncomparable; it is never read

func (u uncomparable) Write(p []byte) (int, error) { return len(p), nil }

func TestOutputWritersSerialiseOneWriterForBoth(t *testing.T) {
	var one bytes.Buffer
	out, errw := OutputWriters(&one, &one)
	if out != errw || out == io.Writer(&one) {
		t.Fatalf("one writer for both: got %T and %T, want one shared locked writer", out, errw)
	}
	var wg sync.WaitGroup
	for _, w := range []io.Writer{out, errw} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				_, _ = w.Write([]byte("x"))
			}
		}()
	}
	wg.Wait()
	if one.Len() != 2000 {
		t.Fatalf("wrote %d bytes through the shared writer, want 2000", one.Len())
	}

	var a, b bytes.Buffer
	if out, errw := OutputWriters(&a, &b); out != io.Writer(&a) || errw != io.Writer(&b) {
		t.Fatal("two writers must be passed on as they are")
	}
	u := uncomparable{}
	if out, errw := OutputWriters(u, u); out == nil || errw == nil {
		t.Fatal("uncomparable writers must be passed on")
	}
	if out, errw := OutputWriters(nil, &a); out != nil || errw != io.Writer(&a) {
		t.Fatal("a nil writer stays nil")
	}
}
