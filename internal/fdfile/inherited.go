package fdfile

import (
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInheritedOnExec marks every descriptor of this process from 3 up
// close-on-exec, as a start of bubblewrap needs: bubblewrap hands its
// command every descriptor it inherits. Go opens its own descriptors
// close-on-exec, and a command's ExtraFiles are placed in the child after
// the fork, so what this catches is what the process inherited without
// the flag from whoever started it (a shell's, a terminal's, a
// supervisor's descriptors: a file, a pipe to a privileged process, a
// directory outside every mount) or a library opened without it. Call it
// before every start, not once: a descriptor may come later.
func CloseInheritedOnExec() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Kernels before 5.11: one by one.
	entries, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return rerr
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		// The directory ReadDir read is closed already: EBADF.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return err
		}
	}
	return nil
}
