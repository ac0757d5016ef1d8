//go:build linux

package areas

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestReadRefusesFilesOverItsLimit(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r, err := OpenRoot("/workspace", dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read("sparse"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("reading a 1 GiB sparse file: %v, want ErrTooLarge", err)
	}
}
