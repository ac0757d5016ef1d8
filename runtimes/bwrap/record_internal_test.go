package bwrap

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestReadRecordReadsItWhole(t *testing.T) {
	dir := t.TempDir()
	// Past the first buffer, and then some.
	want := bytes.Repeat([]byte("0123456789abcdef"), 1000)
	p := filepath.Join(dir, "rec.json")
	if err := os.WriteFile(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("readRecord: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	if got, err := readRecord(filepath.Join(dir, "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing record: %q, %v; want not-exist", got, err)
	}
	if _, err := readRecord(dir); err == nil {
		t.Fatal("a directory read as a record")
	}
	// Bounded: a file past any record's size is refused, not read whole.
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, maxRecord+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := readRecord(big); err == nil {
		t.Fatalf("a %d-byte file read as a record (%d bytes)", maxRecord+1, len(got))
	}
}
