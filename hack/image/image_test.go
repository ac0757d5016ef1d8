package main

import (
	"archive/tar"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// debDir shares the packages `make image` downloads.
const debDir = "../../bin/image/debs"

// staticBinary builds a small static program to stand in for the
// controller (building the controller takes minutes).
func staticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\nfunc main() { println(\"stand-in\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "stand-in")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in: %v\n%s", err, out)
	}
	return bin
}

// The archive is one a registry takes: it is pushed to an in-process
// registry and pulled back with the same digest.
func TestArchivePushesToARegistry(t *testing.T) {
	c := config{controller: staticBinary(t), holder: staticBinary(t), debDir: debDir, packages: defaultPackages, name: "sandbox-controller",
		version: "push-test", out: filepath.Join(t.TempDir(), "image.tar"), arch: "amd64", epoch: 1}
	if _, _, err := build(c); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	untar(t, c.out, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/library/sandbox-controller:push-test" {
		t.Fatalf("index %+v: want one image named docker.io/library/sandbox-controller:push-test", im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	ref, err := name.ParseReference(u.Host + "/sandbox-controller:push-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing: %v", err)
	}
	pulled, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pulling: %v", err)
	}
	want, _ := img.Digest()
	got, _ := pulled.Digest()
	if got != want {
		t.Fatalf("pulled %s, pushed %s", got, want)
	}
}

// A library no package ships fails the build and names the library and
// who needs it, instead of an image whose git cannot start.
func TestMissingLibraryNamed(t *testing.T) {
	c := config{controller: staticBinary(t), holder: staticBinary(t), debDir: debDir, packages: strings.Replace(defaultPackages, ",zlib1g", "", 1),
		name: "x", version: "x", out: filepath.Join(t.TempDir(), "image.tar"), arch: "amd64"}
	_, _, err := build(c)
	if err == nil || !strings.Contains(err.Error(), "libz.so.1, needed by /usr/bin/git") {
		t.Fatalf("build without zlib1g: %v, want an error naming libz.so.1 and /usr/bin/git", err)
	}
}

func TestDynamicControllerRefused(t *testing.T) {
	// Any dynamically linked program stands in for a controller built with
	// cgo: git where the tests' dependencies are installed, the system's
	// shell everywhere else.
	dynamic, err := exec.LookPath("git")
	if err != nil {
		dynamic, err = exec.LookPath("sh")
	}
	if err != nil {
		t.Fatalf("no git and no sh to stand in for a dynamically linked controller: %v", err)
	}
	c := config{controller: dynamic, holder: staticBinary(t), debDir: debDir, packages: defaultPackages, name: "x", version: "x", out: filepath.Join(t.TempDir(), "image.tar"), arch: "amd64"}
	if _, _, err := build(c); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("build with a dynamic controller: %v, want a refusal naming CGO_ENABLED=0", err)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
