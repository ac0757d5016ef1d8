package bwrap_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// gitDirInstance is a running instance of a driver in dir whose Sandbox
// mounts projects (which holds app/.git, a git directory) and binds that
// git directory at its host path; cat prints a file of it as a command
// of the instance sees it.
func gitDirInstance(t *testing.T, dir, projects string) (rt *bwrap.Runtime, in runtimes.Instance, gitDir string, cat func(name string) (int, string)) {
	t.Helper()
	gitDir = filepath.Join(projects, "app", ".git")
	if err := os.MkdirAll(gitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gitDir, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	spec := &v1alpha1.SandboxSpec{
		Agent:    "gitdir",
		Binaries: []v1alpha1.BinaryName{"cat", "sh"},
		Mounts:   []v1alpha1.Mount{{Source: projects, Target: "project", Mode: v1alpha1.MountReadWrite}},
	}
	in, err = instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	testenv.GiveTo(t, in.Identity.UID, projects)
	in.AddBinds(runtimes.Bind{Source: gitDir, Target: gitDir})
	ctx := context.Background()
	if _, err := rt.Ensure(ctx, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(ctx, in.Name) })
	cat = func(name string) (int, string) {
		t.Helper()
		var out, errb bytes.Buffer
		st, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"cat", filepath.Join(gitDir, name)}, Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Fatal(err)
		}
		return st.Code, out.String() + errb.String()
	}
	return rt, in, gitDir, cat
}

// A git directory bind lies in a mount the agent writes to; replacing the
// repository's .git with a link to a host directory must not bind that
// directory into the sandbox.
func TestGitDirBindNeverFollowsALinkOutOfItsMount(t *testing.T) {
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := testenv.SharedDir(t)
	secret := filepath.Join(dir, "host-secret")
	if err := os.MkdirAll(secret, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "HEAD"), []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rt, in, gitDir, cat := gitDirInstance(t, dir, filepath.Join(dir, "projects"))
	ctx := context.Background()

	if code, out := cat("HEAD"); code != 0 || out != "ref: refs/heads/main\n" {
		t.Fatalf("the git directory at its host path: exit %d, %q", code, out)
	}
	var errb bytes.Buffer
	if st, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", "echo x > " + filepath.Join(gitDir, "ORIG_HEAD")}, Stderr: &errb}); err != nil || st.Code != 0 {
		t.Fatalf("writing into the git directory: %v %d %s", err, st.Code, errb.String())
	}

	// What an agent could do through the mount between two commands.
	if err := os.RemoveAll(gitDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, gitDir); err != nil {
		t.Fatal(err)
	}
	if code, out := cat("HEAD"); code == 0 || out == "host secret\n" {
		t.Fatalf("a link out of the mount was bound: exit %d, %q", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(secret, "HEAD")); string(b) != "host secret\n" {
		t.Fatalf("the host directory changed: %q", b)
	}
}

// A git directory on a mount of its own (a hostPath in the controller's
// Pod, a project disk) is bound too: bubblewrap binds the path its
// descriptor names, which the start must hold.
func TestAGitDirOnAMountOfItsOwnIsBound(t *testing.T) {
	needTrees(t)
	dir := testenv.SharedDir(t)
	projects := filepath.Join(dir, "projects")
	if err := testenv.MountAt(t, projects, "tmpfs", "tmpfs", 0, "size=1m,mode=0755"); err != nil {
		t.Fatal(err)
	}
	_, _, _, cat := gitDirInstance(t, dir, projects)
	if code, out := cat("HEAD"); code != 0 || out != "ref: refs/heads/main\n" {
		t.Fatalf("the git directory on its own mount: exit %d, %q", code, out)
	}
}
