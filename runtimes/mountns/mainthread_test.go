package mountns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// Locked during init, the main goroutine is still on the main thread when
// TestMain starts: the main-thread check below needs it there.
func init() { runtime.LockOSThread() }

// mainThreadCheckEnv names the process (by pid) whose mount namespace a
// re-executed test binary joins from its main thread.
const mainThreadCheckEnv = "MOUNTNS_TEST_MAIN_THREAD_CHECK_PID"

// controllerMountNS is this process's own mount namespace, read before any
// test could have moved a thread out of it.
var controllerMountNS string

func TestMain(m *testing.M) {
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading this process's mount namespace:", err)
		os.Exit(2)
	}
	controllerMountNS = ns
	if pid := os.Getenv(mainThreadCheckEnv); pid != "" {
		os.Exit(mainThreadCheck(pid))
	}
	// The tests themselves run as the controller does: any goroutine may
	// land on any thread, the main one included.
	runtime.UnlockOSThread()
	os.Exit(m.Run())
}

// The Go runtime cannot end the main thread, so the goroutine that joins a
// container's mount namespace must never be on it; when it happens to be
// (often, on a loaded machine), the main thread stayed in the container's
// namespace. A re-executed test binary runs the goroutine's body on its
// main thread on purpose, and reports.
func TestMainThreadNeverStaysInAnotherMountNamespace(t *testing.T) {
	pid := otherMountNamespace(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", mainThreadCheckEnv, pid))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("main-thread check: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "the check ran on the main thread") {
		t.Fatalf("the check did not say it ran on the main thread:\n%s", out)
	}
}

// mainThreadCheck runs in the re-executed test binary, on the main thread,
// and returns its exit status.
func mainThreadCheck(pidText string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		return 1
	}
	if tid, pid := unix.Gettid(), unix.Getpid(); tid != pid {
		return fail("not on the main thread (thread %d, process %d): the check would prove nothing", tid, pid)
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil {
		return fail("%s=%q: %v", mainThreadCheckEnv, pidText, err)
	}
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fail("reading the other mount namespace: %v", err)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fail("opening the other mount namespace: %v", err)
	}
	defer ns.Close()
	var workThread int
	var workNS string
	err = offMainThread(ns, func() error {
		workThread = unix.Gettid()
		var err error
		workNS, err = os.Readlink("/proc/thread-self/ns/mnt")
		return err
	})
	if err != nil {
		return fail("working in the other mount namespace: %v", err)
	}
	fmt.Fprintf(os.Stderr, "the check ran on the main thread %d; the work ran on thread %d\n", unix.Getpid(), workThread)
	if workNS != theirs {
		return fail("the work ran in %s, not in the other mount namespace %s", workNS, theirs)
	}
	if now, _ := os.Readlink("/proc/thread-self/ns/mnt"); now != controllerMountNS {
		return fail("the main thread is left in mount namespace %s, not the process's own %s", now, controllerMountNS)
	}
	if workThread == unix.Getpid() {
		return fail("the work ran on the main thread")
	}
	// The thread that joined ends with its goroutine, a moment after the
	// work returns.
	for i := 0; ; i++ {
		stray := threadsOutside(controllerMountNS)
		if len(stray) == 0 {
			return 0
		}
		if i == 3000 {
			return fail("threads still outside the process's mount namespace: %v", stray)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// threadsOutside lists the threads of this process whose mount namespace
// is not ns.
func threadsOutside(ns string) []string {
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/mnt")
	var stray []string
	for _, task := range tasks {
		// A thread that ended between the glob and the read is no stray.
		if theirs, err := os.Readlink(task); err == nil && theirs != ns {
			stray = append(stray, task+" "+theirs)
		}
	}
	return stray
}

// otherMountNamespace starts a process in a mount namespace of its own,
// with private propagation, standing for a container, and returns its pid
// once both are in place.
func otherMountNamespace(t *testing.T) uint32 {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (joining another mount namespace needs CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	testenv.Binary(t, "unshare", "install util-linux")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// unshare makes the namespace, then its mounts private, then execs
	// sleep: a namespace of its own is not enough, since a bind made
	// there while its mounts are still shared propagates back into ours.
	for i := 0; ; i++ {
		theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if theirs != "" && theirs != controllerMountNS && string(comm) == "sleep\n" {
			return uint32(pid)
		}
		if i == 3000 {
			t.Fatalf("the helper process never got a private mount namespace of its own (namespace %q, ours %q, command %q)", theirs, controllerMountNS, comm)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
