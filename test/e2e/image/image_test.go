//go:build e2e

// Package image proves `make image`: the OCI archive it writes imports into
// a real containerd, and the controller, bwrap and git run from it (the
// binaries find their libraries without the host's).
package image

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const (
	namespace = "sandbox-controller-image-test"
	version   = "e2e-test"
	wantRef   = "docker.io/library/sandbox-controller:" + version
)

func TestImageImportsAndRuns(t *testing.T) {
	ce := testenv.ContainerdEnv(t, false)
	addr := ce.Address
	tarball := filepath.Join(t.TempDir(), "image.tar")
	build := exec.Command("make", "--no-print-directory", "-C", "../../..", "image", "VERSION="+version, "IMAGE_TAR="+tarball)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	st, err := os.Stat(tarball)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image archive: %.1f MiB", float64(st.Size())/(1<<20))

	c, err := containerd.New(addr, containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("connecting to containerd at %s: %v", addr, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), namespace), 5*time.Minute)
	defer cancel()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := c.Import(ctx, f)
	f.Close()
	if err != nil {
		t.Fatalf("importing the image archive: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Name != wantRef {
		t.Fatalf("imported %v, want one image named %s", imgs, wantRef)
	}
	defer func() { _ = c.ImageService().Delete(context.WithoutCancel(ctx), wantRef, images.SynchronousDelete()) }()
	img := containerd.NewImage(c, imgs[0])
	if err := img.Unpack(ctx, ""); err != nil {
		t.Fatalf("unpacking %s: %v", wantRef, err)
	}

	for _, tc := range []struct {
		name string
		args []string // nil runs the image's entrypoint with these arguments
		want string
	}{
		{name: "controller-version", args: []string{"--version"}, want: "sandbox-controller " + version},
		{name: "controller-help", args: []string{"--help"}, want: "-log-format"},
		{name: "bwrap-finds-its-libraries", args: []string{"/usr/bin/bwrap", "--version"}, want: "bubblewrap"},
		{name: "git-finds-its-libraries", args: []string{"/usr/bin/git", "--version"}, want: "git version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := run(ctx, t, c, img, tc.name, tc.args)
			if !strings.Contains(out, tc.want) {
				t.Fatalf("output %q does not contain %q", out, tc.want)
			}
		})
	}
}

// run starts one container of the image and returns what it printed. An
// argument list starting with / replaces the entrypoint.
func run(ctx context.Context, t *testing.T, c *containerd.Client, img containerd.Image, id string, args []string) string {
	t.Helper()
	id = "image-" + id
	specOpts := []oci.SpecOpts{oci.WithImageConfigArgs(img, args)}
	if strings.HasPrefix(args[0], "/") {
		specOpts = []oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs(args...)}
	}
	ctr, err := c.NewContainer(ctx, id, containerd.WithNewSnapshot(id, img), containerd.WithNewSpec(specOpts...))
	if err != nil {
		t.Fatalf("creating container %s: %v", id, err)
	}
	defer func() { _ = ctr.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup) }()
	var stdout, stderr bytes.Buffer
	creator := cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr))
	if dir := os.Getenv(testenv.ContainerdFIFODirEnv); dir != "" {
		creator = cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(dir))
	}
	task, err := ctr.NewTask(ctx, creator)
	if err != nil {
		t.Fatalf("creating the task of %s: %v", id, err)
	}
	defer func() { _, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill) }()
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("starting %s: %v", id, err)
	}
	st := <-exited
	code, _, err := st.Result()
	if err != nil {
		t.Fatal(err)
	}
	_ = task.CloseIO(ctx)
	// The task's output is complete once its IO is closed.
	if io := task.IO(); io != nil {
		io.Wait()
	}
	out := stdout.String() + stderr.String()
	if code != 0 {
		t.Fatalf("%s exited with %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}
