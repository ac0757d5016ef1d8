package containerd

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeDaemon is a unix socket this process answers, as containerd answers the
// driver's; hangUp closes the connections it accepted.
type fakeDaemon struct {
	sock  string
	mu    sync.Mutex
	conns []net.Conn
}

func answering(t *testing.T) *fakeDaemon {
	t.Helper()
	d := &fakeDaemon{sock: filepath.Join(t.TempDir(), "daemon.sock")}
	l, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); d.hangUp() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			d.mu.Lock()
			d.conns = append(d.conns, c)
			d.mu.Unlock()
		}
	}()
	return d
}

func (d *fakeDaemon) hangUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

func sameFile(t *testing.T, f *os.File, path string) bool {
	t.Helper()
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(path, &b); err != nil {
		t.Fatal(err)
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// The namespace opened is that of the process answering the socket: here
// this one, as containerd is for the driver.
func TestDaemonNamespaceIsThePeers(t *testing.T) {
	d := answering(t)
	for _, address := range []string{d.sock, "unix://" + d.sock} {
		ns, err := daemonNamespace("/proc", address)
		if err != nil {
			t.Fatalf("%s: %v", address, err)
		}
		if !sameFile(t, ns, "/proc/self/ns/mnt") {
			t.Errorf("%s: opened %s, not the answering process's mount namespace", address, ns.Name())
		}
		ns.Close()
	}
	if _, err := daemonNamespace("/proc", filepath.Join(t.TempDir(), "nobody.sock")); err == nil {
		t.Fatal("a socket nobody answers has a namespace")
	}
}

// A daemon that hangs up is seen: its pid may belong to another process
// by the time its namespace is opened, so that namespace is not used.
func TestStillConnectedSeesAHangUp(t *testing.T) {
	d := answering(t)
	conn, err := net.Dial("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := stillConnected(raw); err != nil {
		t.Fatalf("a connection the daemon holds: %v", err)
	}
	// Until the daemon has accepted it, there is nothing to hang up.
	for deadline := time.Now().Add(5 * time.Second); ; {
		d.mu.Lock()
		n := len(d.conns)
		d.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	d.hangUp()
	for deadline := time.Now().Add(5 * time.Second); stillConnected(raw) == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the daemon hung up and stillConnected did not see it")
		}
		time.Sleep(time.Millisecond)
	}
}

// With DaemonMountNamespace the driver runs tree work on a thread that
// joined the answering process's namespace; without an answer it runs
// nothing, and New refuses a namespace file that is no mount namespace.
func TestTreesNamespaceFromTheDaemon(t *testing.T) {
	d := answering(t)
	r := &Runtime{cfg: Config{Address: d.sock, MountNamespace: DaemonMountNamespace, ProcDir: "/proc"}}
	ran := false
	if err := r.inTreesNamespace(func() error {
		ran = true
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

	r.cfg.Address = filepath.Join(t.TempDir(), "gone.sock")
	if err := r.inTreesNamespace(func() error { t.Error("ran without a daemon"); return nil }); err == nil {
		t.Fatal("no error without a daemon")
	}
	if _, err := New(t.Context(), Config{Address: d.sock, MountNamespace: "/proc/self/ns/net"}); err == nil {
		t.Fatal("New took a network namespace as containerd's mount namespace")
	}

	// A namespace named by a path is the one the path named at start:
	// held, not opened again (a /proc/PID path may name another process,
	// or none, later).
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	byPath, err := New(t.Context(), Config{Address: d.sock, MountNamespace: fmt.Sprintf("/proc/%d/ns/mnt", sleeper.Process.Pid)})
	if err != nil {
		t.Fatal(err)
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	ran = false
	if err := byPath.inTreesNamespace(func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("the namespace opened at start, its process gone: ran %v, %v", ran, err)
	}
}
