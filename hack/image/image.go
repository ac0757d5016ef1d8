package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// controllerPath is where the image keeps the controller; the entrypoint.
const controllerPath = "usr/local/bin/sandbox-controller"

// holderPath is where it keeps the holder, which a bwrap Sandbox's Pod
// copies into its image's container and runs there (cmd/sandbox-holder).
const holderPath = "usr/local/bin/sandbox-holder"

// The image's /etc: root and nobody, and name lookups from files only (the
// controller is a static Go binary; bwrap and git use glibc's files
// backend, built into libc.so.6 since glibc 2.34).
var etcFiles = map[string]string{
	"etc/passwd":        "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
	"etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
}

// readStatic reads the static binary at p, what names it in messages.
func readStatic(p, what string) ([]byte, error) {
	bin, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading the %s binary: %w", what, err)
	}
	if static, err := isStatic(bin); err != nil {
		return nil, fmt.Errorf("reading the %s binary %s: %w", what, p, err)
	} else if !static {
		return nil, fmt.Errorf("the %s binary %s is linked dynamically: build it with CGO_ENABLED=0 (the image has no libraries for it)", what, p)
	}
	return bin, nil
}

func build(c config) (ref string, size int64, err error) {
	bin, err := readStatic(c.controller, "controller")
	if err != nil {
		return "", 0, err
	}
	holder, err := readStatic(c.holder, "holder")
	if err != nil {
		return "", 0, err
	}
	debs, err := fetchDebs(c.debDir, c.arch, c.packageList())
	if err != nil {
		return "", 0, err
	}
	pkgs := tree{}
	for _, d := range debs {
		if err := unpack(pkgs, d); err != nil {
			return "", 0, err
		}
	}
	system, err := systemTree(pkgs, c)
	if err != nil {
		return "", 0, err
	}
	ctrl := tree{
		controllerPath: {kind: kindFile, mode: 0o755, data: bin},
		holderPath:     {kind: kindFile, mode: 0o755, data: holder},
	}

	mtime := time.Unix(c.epoch, 0).UTC()
	img := empty.Image
	for _, l := range []struct {
		t   tree
		why string
	}{
		{system, "bubblewrap, git and their libraries from Debian packages; /etc"},
		{ctrl, "the controller and the holder " + c.version},
	} {
		layer, err := layerOf(l.t, mtime)
		if err != nil {
			return "", 0, err
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: mtime}, CreatedBy: "hack/image: " + l.why}}); err != nil {
			return "", 0, fmt.Errorf("adding a layer: %w", err)
		}
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return "", 0, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = c.arch, "linux"
	cf.Created = v1.Time{Time: mtime}
	cf.Config = v1.Config{
		Entrypoint: []string{"/" + controllerPath},
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		User:       "0:0",
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":   "sandbox-controller",
			"org.opencontainers.image.version": c.version,
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", 0, err
	}

	ref = imageRef(c.name, c.version)
	size, err = writeArchive(img, c, ref, mtime)
	return ref, size, err
}

// systemTree is everything of the image but the controller: bwrap and git
// with their libraries and nothing else of their packages but git's
// templates (which keep git init and git worktree add quiet) and each
// package's copyright file; the merged-/usr links; the directories a
// container expects; a minimal /etc.
func systemTree(pkgs tree, c config) (tree, error) {
	// git runs its own built-ins through /usr/lib/git-core/git; nothing the
	// controller runs needs git's other helpers (perl, curl, the daemon).
	keep, err := pkgs.closure(c.arch, "usr/bin/bwrap", "usr/bin/git", "usr/lib/git-core/git")
	if err != nil {
		return nil, err
	}
	pkgs.subtree(keep, "usr/share/git-core/templates")
	for _, p := range c.packageList() {
		cp := path.Join("usr/share/doc", p, "copyright")
		if _, ok := pkgs[cp]; ok {
			keep[cp] = true
		}
	}
	out := tree{}
	for _, p := range sortedPaths(keep) {
		if e, ok := pkgs[p]; ok {
			out[p] = e
		} else {
			out[p] = &entry{kind: kindDir, mode: 0o755}
		}
	}
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/local/bin", "etc", "proc", "sys", "dev", "run", "var/lib/sandbox-controller"} {
		if _, ok := out[d]; !ok {
			out[d] = &entry{kind: kindDir, mode: 0o755}
		}
	}
	out["root"] = &entry{kind: kindDir, mode: 0o700}
	out["tmp"] = &entry{kind: kindDir, mode: 0o777 | fs.ModeSticky}
	out["var/tmp"] = &entry{kind: kindDir, mode: 0o777 | fs.ModeSticky}
	for _, d := range []string{"bin", "sbin", "lib"} {
		out[d] = &entry{kind: kindSymlink, link: "usr/" + d}
	}
	if _, ok := out["usr/lib64"]; ok {
		out["lib64"] = &entry{kind: kindSymlink, link: "usr/lib64"}
	}
	for p, s := range etcFiles {
		out[p] = &entry{kind: kindFile, mode: 0o644, data: []byte(s)}
	}
	return out, nil
}

// layerOf writes t as an uncompressed layer tarball (sorted, owned by
// root, every time the same) and wraps it as an OCI layer, gzip-compressed.
func layerOf(t tree, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(t))
	for p := range t {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	written := map[[sha256.Size]byte]string{}
	for _, p := range paths {
		e := t[p]
		h := &tar.Header{Name: p, Mode: int64(e.mode.Perm()), ModTime: mtime, Format: tar.FormatPAX}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		var body []byte
		sum := sha256.Sum256(e.data)
		switch first, dup := written[sum]; {
		case e.kind == kindDir:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case e.kind == kindSymlink:
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		case dup && len(e.data) > 0 && t[first].mode == e.mode:
			// Debian ships git twice (/usr/bin/git and git-core/git): one
			// copy and a hard link.
			h.Typeflag, h.Linkname = tar.TypeLink, first
		default:
			h.Typeflag, h.Size, body = tar.TypeReg, int64(len(e.data)), e.data
			written[sum] = p
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing %s into a layer: %w", p, err)
		}
		if _, err := tw.Write(body); err != nil {
			return nil, fmt.Errorf("writing %s into a layer: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
}

// writeArchive writes img as an OCI image layout and packs the layout into
// c.out. io.containerd.image.name names the image on `ctr images import`;
// org.opencontainers.image.ref.name is the tag other tools read.
func writeArchive(img v1.Image, c config, ref string, mtime time.Time) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(c.out), 0o755); err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(c.out), ".image-layout-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return 0, fmt.Errorf("writing the image layout: %w", err)
	}
	if err := lp.AppendImage(img,
		layout.WithAnnotations(map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": c.version}),
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: c.arch})); err != nil {
		return 0, fmt.Errorf("writing the image layout: %w", err)
	}
	tmp := c.out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	var files []string
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		f.Close()
		return 0, err
	}
	sort.Strings(files)
	for _, p := range files {
		rel, _ := filepath.Rel(dir, p)
		if err := addFile(tw, p, filepath.ToSlash(rel), mtime); err != nil {
			f.Close()
			return 0, fmt.Errorf("packing the image layout: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, c.out); err != nil {
		return 0, err
	}
	st, err := os.Stat(c.out)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func addFile(tw *tar.Writer, src, name string, mtime time.Time) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: st.Size(), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
