//go:build linux

package areas

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The file API's listing and recursive remove, on a directory of a
// thousand files (make A/B runs of these when List or Remove change).
func BenchmarkList1000(b *testing.B) {
	dir := b.TempDir()
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	r, err := OpenRoot("/workspace", dir, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if es, err := r.List("."); err != nil || len(es) != 1000 {
			b.Fatal(len(es), err)
		}
	}
}

func BenchmarkRemoveTree1000(b *testing.B) {
	dir := b.TempDir()
	r, err := OpenRoot("/workspace", dir, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for d := range 10 {
			sub := filepath.Join(dir, "t", strconv.Itoa(d))
			if err := os.MkdirAll(sub, 0o755); err != nil {
				b.Fatal(err)
			}
			for i := range 100 {
				if err := os.WriteFile(filepath.Join(sub, strconv.Itoa(i)), nil, 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StartTimer()
		if err := r.Remove("t", true); err != nil {
			b.Fatal(err)
		}
	}
}
