// Command sandbox-holder keeps a bwrap Sandbox's Pod's container running
// on a cluster, where the Sandbox names an image (spec.bwrap.image): the
// container is made from that image only so that the node's container
// runtime mounts its file system, which the node's controller binds as the
// system directories of the Sandbox's commands. Nothing of the image runs.
//
//	sandbox-holder install DIR   copy this binary to DIR/sandbox-holder
//	                             (the Pod's init container, from the
//	                             controller's image, into an emptyDir)
//	sandbox-holder               sleep until SIGTERM or SIGINT, reaping any
//	                             child handed to it (the container's PID 1)
//	sandbox-holder start-in-cgroups ...
//	                             the starter of a command on cgroup v1: move
//	                             into the instance's cgroups, take the
//	                             command's ids and become it (run by the
//	                             controller beside which it lies; see
//	                             runtimes/cgroup's starter)
//
// It is static and small, so that it runs in any image of the node's
// architecture, one with no libc or shell included.
package main

import (
	"errors"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// Name is the file name install writes.
const Name = "sandbox-holder"

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == "install":
		if err := install(os.Args[2]); err != nil {
			os.Stderr.WriteString("sandbox-holder: " + err.Error() + "\n")
			os.Exit(1)
		}
	case len(os.Args) >= 2 && os.Args[1] == cgroup.StarterVerb:
		// The controller reads a failure from the starter's pipe; the
		// command's stderr hears only of a starter run wrongly.
		if err := cgroup.RunStarter(os.Args[2:]); errors.Is(err, cgroup.ErrStarterUsage) {
			os.Stderr.WriteString("sandbox-holder: " + err.Error() + "\n")
		}
		os.Exit(127)
	case len(os.Args) == 1:
		hold(nil)
	default:
		os.Stderr.WriteString("usage: sandbox-holder [install DIR | " + cgroup.StarterVerb + " ...]\n")
		os.Exit(2)
	}
}

// install copies the running binary to dir/Name, whole or not at all.
func install(dir string) error {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, "."+Name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, Name))
}

// hold sleeps until told to stop; ready, when not nil, is closed once
// the signals are caught.
func hold(ready chan<- struct{}) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	if ready != nil {
		close(ready)
	}
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
