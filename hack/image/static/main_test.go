package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun writes an image of one file and reads the archive back: an
// OCI layout whose index names the image, and a layer holding the file at
// its destination with mode 0755.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	if err := run("localhost/test/tool:1", out, "/usr/bin/tool -x", "amd64", files{bin + ":/usr/bin/tool"}); err != nil {
		t.Fatal(err)
	}
	entries := readTar(t, out)
	for _, want := range []string{"oci-layout", "index.json"} {
		if _, ok := entries[want]; !ok {
			t.Fatalf("archive has no %s: %v", want, keys(entries))
		}
	}
	if !strings.Contains(string(entries["index.json"]), `"io.containerd.image.name": "localhost/test/tool:1"`) &&
		!strings.Contains(string(entries["index.json"]), `"io.containerd.image.name":"localhost/test/tool:1"`) {
		t.Fatalf("index.json does not name the image: %s", entries["index.json"])
	}
	var found bool
	for name, data := range entries {
		if !strings.HasPrefix(name, "blobs/sha256/") || len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
			continue // not a gzip layer
		}
		layer := filepath.Join(dir, "layer.tgz")
		if err := os.WriteFile(layer, data, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(layer)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		gz, err := gzipReader(f)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(gz)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Name == "usr/bin/tool" {
				found = true
				if h.Mode&0o777 != 0o755 {
					t.Errorf("usr/bin/tool has mode %o, want 755", h.Mode)
				}
			}
		}
	}
	if !found {
		t.Fatal("no layer holds usr/bin/tool")
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = data
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func gzipReader(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }
