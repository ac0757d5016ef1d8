package mountns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

func TestMountedIn(t *testing.T) {
	pid := uint32(os.Getpid())
	if ok, err := MountedIn(pid, "/proc"); err != nil || !ok {
		t.Fatalf("/proc is a mount point of this process: %v, %v", ok, err)
	}
	if ok, err := MountedIn(pid, "/proc/self"); err != nil || ok {
		t.Fatalf("/proc/self is no mount point: %v, %v", ok, err)
	}
	if _, err := MountedIn(0, "/"); err == nil {
		t.Fatal("a process that does not exist has no mounts to read")
	}
}

// A process in a mount namespace of its own stands for a container.
func TestInjectAndEjectInAnotherMountNamespace(t *testing.T) {
	pid := otherMountNamespace(t)

	projects := t.TempDir()
	gitDir := filepath.Join(projects, "app", ".git")
	target := filepath.Join(t.TempDir(), "seen", ".git")
	if err := os.MkdirAll(gitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gitDir, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := runtimes.Instance{Mounts: []runtimes.Bind{{Source: projects, Target: "/workspace/project"}}}
	bind := runtimes.Bind{Source: gitDir, Target: target, GitDir: true}
	in.Mounts = append(in.Mounts, bind)

	if err := Inject(pid, in, []runtimes.Bind{bind}); err != nil {
		t.Fatal(err)
	}
	if ok, err := MountedIn(pid, target); err != nil || !ok {
		t.Fatalf("not mounted in the other namespace: %v, %v", ok, err)
	}
	if ok, _ := MountedIn(uint32(os.Getpid()), target); ok {
		t.Fatal("the bind leaked into the controller's own namespace")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s/HEAD", pid, target))
	if err != nil || string(b) != "ref: refs/heads/main\n" {
		t.Fatalf("the git directory seen from the other namespace: %q, %v", b, err)
	}
	if err := Inject(pid, in, []runtimes.Bind{bind}); err != nil {
		t.Fatal(err)
	}
	if err := Eject(pid, []runtimes.Bind{bind}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := MountedIn(pid, target); ok {
		t.Fatal("still mounted after Eject: a second Inject stacked a mount")
	}

	// A .git replaced by a link out of its mount is left out.
	secret := t.TempDir()
	if err := os.RemoveAll(gitDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, gitDir); err != nil {
		t.Fatal(err)
	}
	if err := Inject(pid, in, []runtimes.Bind{bind}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := MountedIn(pid, target); ok {
		t.Fatal("a link out of the mount was bound")
	}
	if now, _ := os.Readlink("/proc/self/ns/mnt"); now != controllerMountNS {
		t.Fatalf("the main thread is left in mount namespace %s, not the process's own %s", now, controllerMountNS)
	}
}

// The agent replaces a directory on a git directory's target path with a
// link: the bind is refused rather than landing where the link leads, and
// an unbind through a link leaves the mount the link leads to alone.
func TestTargetsAreNeverReachedThroughLinks(t *testing.T) {
	pid := otherMountNamespace(t)
	projects := t.TempDir()
	gitDir := filepath.Join(projects, "app", ".git")
	if err := os.MkdirAll(gitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	in := runtimes.Instance{Mounts: []runtimes.Bind{{Source: projects, Target: "/workspace/project"}}}
	base := t.TempDir()
	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.MkdirAll(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}

	t.Run("a link on the target's path is refused", func(t *testing.T) {
		if err := os.Symlink(elsewhere, filepath.Join(base, "linked")); err != nil {
			t.Fatal(err)
		}
		bind := runtimes.Bind{Source: gitDir, Target: filepath.Join(base, "linked", ".git"), GitDir: true}
		// The bind is left out, as one whose directory cannot be opened.
		if err := Inject(pid, in, []runtimes.Bind{bind}); err != nil {
			t.Fatalf("Inject through a link = %v, want the bind left out", err)
		}
		dir, err := in.OpenGitDir(bind)
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		if err := injectBind(pid, dir, bind); !errors.Is(err, ErrLinkInPath) {
			t.Fatalf("binding through a link = %v, want ErrLinkInPath", err)
		}
		if ok, _ := MountedIn(pid, filepath.Join(elsewhere, ".git")); ok {
			t.Fatal("the bind landed where the link leads")
		}
		if _, err := os.Lstat(filepath.Join(elsewhere, ".git")); err == nil {
			t.Fatal("a directory was made where the link leads")
		}
	})

	t.Run("an unbind through a link is refused", func(t *testing.T) {
		real := filepath.Join(base, "real")
		bind := runtimes.Bind{Source: gitDir, Target: filepath.Join(real, ".git"), GitDir: true}
		if err := Inject(pid, in, []runtimes.Bind{bind}); err != nil {
			t.Fatal(err)
		}
		moved := filepath.Join(base, "moved")
		if err := os.Rename(real, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, real); err != nil {
			t.Fatal(err)
		}
		// The mount went with its directory; the target's path is a link
		// to it now.
		if ok, _ := MountedIn(pid, filepath.Join(moved, ".git")); !ok {
			t.Fatal("the mount did not move with its directory")
		}
		// Eject checks the target is mounted first; the agent swaps the
		// link in between. The unbind itself is what must not follow it.
		err := inMountNamespace(pid, func() error { return unmountTarget(bind.Target) })
		if !errors.Is(err, ErrLinkInPath) {
			t.Fatalf("unbinding through a link = %v, want ErrLinkInPath", err)
		}
		if ok, _ := MountedIn(pid, filepath.Join(moved, ".git")); !ok {
			t.Fatal("the unbind followed the link and detached the mount it leads to")
		}
	})
}

// RunInNamespace works in the namespace it is given: a mount fn makes there is
// seen there and not here, and paths fn opens resolve there.
func TestRunInMountsInThatNamespace(t *testing.T) {
	pid := otherMountNamespace(t)
	dir := t.TempDir()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	err = RunInNamespace(ns, func() error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "made-there"), []byte("x"), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := MountedIn(pid, dir); err != nil || !ok {
		t.Fatalf("not mounted in the namespace RunInNamespace was given: %v, %v", ok, err)
	}
	if ok, _ := MountedIn(uint32(os.Getpid()), dir); ok {
		t.Fatal("the mount was made in the caller's own namespace")
	}
	if _, err := os.Stat(filepath.Join(dir, "made-there")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file written there is here: %v", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s/made-there", pid, dir)); err != nil {
		t.Fatalf("the file written there is not there: %v", err)
	}
	if now, _ := os.Readlink("/proc/self/ns/mnt"); now != controllerMountNS {
		t.Fatalf("the main thread is left in mount namespace %s, not the process's own %s", now, controllerMountNS)
	}

	// Anything but a mount namespace is refused before a thread joins it.
	ran := false
	for _, bad := range []string{"/proc/self/ns/net", "/etc/hostname"} {
		f, err := os.Open(bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := RunInNamespace(f, func() error { ran = true; return nil }); err == nil {
			t.Errorf("RunInNamespace(%s) accepted", bad)
		}
		f.Close()
	}
	if ran {
		t.Fatal("fn ran in a namespace that is not a mount namespace")
	}
}
