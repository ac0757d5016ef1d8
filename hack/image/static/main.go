// Command static writes a one-layer OCI image of static binaries, with no
// registry and no container engine: the cluster's pause image and its
// smoke-test image (hack/cluster.sh). The output is an OCI image layout
// tarball that `ctr images import` takes; its io.containerd.image.name
// annotation names the image.
//
//	static -name localhost/cluster/pause:1 -out pause.tar -file bin/pause:/pause -entrypoint /pause
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	var fs files
	name := flag.String("name", "", "full image reference, e.g. localhost/cluster/pause:1")
	out := flag.String("out", "", "OCI image layout tarball to write")
	entry := flag.String("entrypoint", "", "entrypoint, words separated by spaces")
	arch := flag.String("arch", runtime.GOARCH, "image architecture")
	flag.Var(&fs, "file", "SRC:DEST, a file copied to DEST in the image, mode 0755 (repeatable)")
	flag.Parse()
	if *name == "" || *out == "" || len(fs) == 0 {
		fmt.Fprintln(os.Stderr, "static: -name, -out and at least one -file are required")
		os.Exit(2)
	}
	if err := run(*name, *out, *entry, *arch, fs); err != nil {
		fmt.Fprintln(os.Stderr, "static:", err)
		os.Exit(1)
	}
}

func run(name, out, entry, arch string, fs files) error {
	epoch := time.Unix(0, 0).UTC()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(p string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Name: p + "/", Typeflag: tar.TypeDir, Mode: mode, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(p string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"dev", "etc", "proc", "sys", "run", "var", "var/run"} {
		if err := dir(d, 0o755); err != nil {
			return err
		}
	}
	if err := dir("tmp", 0o1777); err != nil {
		return err
	}
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n")); err != nil {
		return err
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")); err != nil {
		return err
	}
	sort.Strings(fs)
	made := map[string]bool{}
	for _, f := range fs {
		src, dest, ok := strings.Cut(f, ":")
		if !ok {
			return fmt.Errorf("-file %q: want SRC:DEST", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		dest = strings.TrimPrefix(filepath.Clean("/"+dest), "/")
		// Parent directories of DEST that the fixed ones above do not cover.
		parts := strings.Split(filepath.Dir(dest), "/")
		for i := range parts {
			d := strings.Join(parts[:i+1], "/")
			if d == "." || made[d] || d == "etc" || d == "tmp" || d == "run" || d == "var" || d == "var/run" {
				continue
			}
			made[d] = true
			if err := dir(d, 0o755); err != nil {
				return err
			}
		}
		if err := file(dest, 0o755, data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "hack/image/static"}})
	if err != nil {
		return err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = arch, "linux", v1.Time{Time: epoch}
	cf.Config = v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, WorkingDir: "/"}
	if entry != "" {
		cf.Config.Entrypoint = strings.Fields(entry)
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tag := name[strings.LastIndex(name, ":")+1:]
	return writeArchive(img, out, arch, map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag})
}

// writeArchive writes img as an image layout in a temporary directory and
// packs that directory into out.
func writeArchive(img v1.Image, out, arch string, ann map[string]string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmpDir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmpDir)
	lp, err := layout.Write(tmpDir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(ann), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		return err
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(tmpDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tmpDir, p)
		if err := tw.WriteHeader(&tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
