package fdfile

import (
	"testing"

	"golang.org/x/sys/unix"
)

// A descriptor the process inherited without close-on-exec (made here
// without it) gets it, and stays open for the process itself.
func TestCloseInheritedOnExecMarksEveryDescriptor(t *testing.T) {
	var fds []int
	for range 3 {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
	}
	if err := CloseInheritedOnExec(); err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			t.Fatalf("descriptor %d is no longer open: %v", fd, err)
		}
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("descriptor %d is not close-on-exec", fd)
		}
	}
	for fd := range 3 {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC != 0 {
			t.Errorf("standard descriptor %d was made close-on-exec", fd)
		}
	}
}
