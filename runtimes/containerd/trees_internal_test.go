package containerd

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// answering is a unix socket this process answers until the test ends.
func answering(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "daemon.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return sock
}

// socketPeer names the process that answers a socket: here this one, as
// containerd is for the driver.
func TestSocketPeerIsTheProcessAnsweringTheSocket(t *testing.T) {
	sock := answering(t)
	for _, address := range []string{sock, "unix://" + sock} {
		pid, err := socketPeer(address)
		if err != nil {
			t.Fatalf("%s: %v", address, err)
		}
		if int(pid) != os.Getpid() {
			t.Fatalf("%s: peer pid %d, want %d", address, pid, os.Getpid())
		}
	}
	if _, err := socketPeer(filepath.Join(t.TempDir(), "nobody.sock")); err == nil {
		t.Fatal("a socket nobody answers has a peer")
	}
}

// With DaemonMountNamespace the driver joins the namespace of the process
// answering the socket: a namespace file that is not a mount namespace is
// refused before anything runs.
func TestTreesNamespaceFromTheDaemon(t *testing.T) {
	sock := answering(t)
	r := &Runtime{cfg: Config{Address: sock, MountNamespace: DaemonMountNamespace, ProcDir: "/proc"}}
	ran := false
	if err := r.inTreesNamespace(func() error {
		ran = true
		// This thread is in this process's namespace: the daemon's.
		self, err := os.Readlink("/proc/thread-self/ns/mnt")
		if err != nil {
			return err
		}
		want, err := os.Readlink("/proc/self/ns/mnt")
		if err != nil {
			return err
		}
		if self != want {
			t.Errorf("joined %s, want the daemon's %s", self, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("fn did not run")
	}

	// A socket nobody answers: an error, and fn does not run.
	r.cfg.Address = filepath.Join(t.TempDir(), "gone.sock")
	if err := r.inTreesNamespace(func() error { t.Error("ran without a daemon"); return nil }); err == nil {
		t.Fatal("no error without a daemon")
	}
	// A namespace file that is no mount namespace is refused by New.
	if _, err := New(t.Context(), Config{Address: sock, MountNamespace: "/proc/self/ns/net"}); err == nil {
		t.Fatal("New took a network namespace as containerd's mount namespace")
	}
}
