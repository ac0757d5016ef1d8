//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The starter is a small process of its own (cmd/sandbox-holder) that a
// cgroup v1 start goes through (Manager.Starter): it is forked where the
// controller is, moves itself into the instance's cgroups, takes the
// command's ids and becomes the command. A process moving itself (0 into
// a hierarchy's tasks) takes neither the kernel's global cgroup lock nor
// an RCU grace period, which moving another process by its pid waits for
// (5 to 15 ms a start on some hosts); the starter costs one exec of a
// small static binary (about 0.5 ms on those hosts, 7 ms where page
// faults are slow: MeasureStarts tells which start is faster where the
// controller runs). The controller never joins an instance's cgroups,
// and the command is inside them from its first instruction.
//
// Its argument list, after StarterVerb:
//
//	ERRFD COUNT UID GID GROUPS -- PATH ARGV0 ARGS...
//
// ERRFD is a pipe a failure is written to (it closes on the exec); the
// COUNT descriptors after it are the instance's tasks files, one per
// hierarchy, opened by the controller, so the starter walks no path. UID
// and GID are the ids to take, "-" to keep the controller's; GROUPS the
// supplementary groups, comma-separated, empty for none.

// StarterVerb is the first argument that makes the starter start a
// command (RunStarter).
const StarterVerb = "start-in-cgroups"

// ErrStarterUsage is RunStarter's error for arguments it cannot read
// well enough to report on ERRFD.
var ErrStarterUsage = errors.New("usage: " + StarterVerb + " ERRFD COUNT UID GID GROUPS -- PATH ARGV0 [ARGS...]")

// StarterName is the starter's file name, as the controller's image and
// `make build` place it beside the controller.
const StarterName = "sandbox-holder"

// StarterBeside finds the starter beside the executable exe (the
// controller's own, normally): it is run as root, so it must be a
// regular file that only root (or this process's user) may change.
// Missing, it returns "" and no error; unfit, "" and why.
func StarterBeside(exe string) (string, error) {
	p := filepath.Join(filepath.Dir(exe), StarterName)
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if err := CheckStarter(p, fi); err != nil {
		return "", err
	}
	return p, nil
}

// CheckStarter refuses a starter another user could have written: this
// process runs it with its own ids, root's on a node.
func CheckStarter(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("the starter %s is not a regular file (%v)", path, fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("the starter %s: no owner to check", path)
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("the starter %s belongs to uid %d, not to root or this process's user", path, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("the starter %s may be written by its group or others (%v)", path, fi.Mode().Perm())
	}
	return nil
}

// startVia starts cmd through the starter (see above). The starter's
// failure to move itself or to become the command is Start's error, and
// no process is left.
func (m *Manager) startVia(name string, cmd *exec.Cmd) (err error) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	defer r.Close()
	files = append(files, w)
	for _, c := range v1Controllers {
		f, err := os.OpenFile(filepath.Join(m.Dir(c, name), "tasks"), os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("opening the %s cgroup of %s to start %s: %w", c, name, cmd.Path, err)
		}
		files = append(files, f)
	}

	uid, gid, groups := "-", "-", ""
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if cr := cmd.SysProcAttr.Credential; cr != nil {
		if cr.NoSetGroups {
			return fmt.Errorf("starting %s: the starter always sets the supplementary groups (NoSetGroups)", cmd.Path)
		}
		uid, gid = strconv.FormatUint(uint64(cr.Uid), 10), strconv.FormatUint(uint64(cr.Gid), 10)
		ids := make([]string, len(cr.Groups))
		for i, g := range cr.Groups {
			ids[i] = strconv.FormatUint(uint64(g), 10)
		}
		groups = strings.Join(ids, ",")
	}
	path, args, extra, cred := cmd.Path, cmd.Args, cmd.ExtraFiles, cmd.SysProcAttr.Credential
	errFD := 3 + len(extra)
	cmd.Path = m.Starter
	cmd.Args = append([]string{m.Starter, StarterVerb, strconv.Itoa(errFD), strconv.Itoa(len(files) - 1), uid, gid, groups, "--", path}, args...)
	cmd.ExtraFiles = append(extra[:len(extra):len(extra)], files...)
	// The starter takes the ids itself, after it has moved: as the
	// command's user it could not write its tasks files.
	cmd.SysProcAttr.Credential = nil
	err = cmd.Start()
	cmd.Path, cmd.Args, cmd.ExtraFiles, cmd.SysProcAttr.Credential = path, args, extra, cred
	if err != nil {
		return atPidsLimit(err, name)
	}
	for _, f := range files {
		f.Close()
	}
	files = nil
	// The pipe ends when the starter becomes the command (close on exec)
	// or exits; what it wrote before is why it failed.
	msg, rerr := io.ReadAll(io.LimitReader(r, 4096))
	if len(msg) == 0 && rerr == nil {
		return nil
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if len(msg) == 0 {
		return fmt.Errorf("starting %s in the cgroups of %s: reading the starter's answer: %w", path, name, rerr)
	}
	return atPidsLimit(fmt.Errorf("starting %s in the cgroups of %s: %s", path, name, msg), name)
}

// RunStarter is the starter's side (see above): args are its arguments
// after StarterVerb. It returns only on failure, having written the
// reason to ERRFD when it could read it; the caller exits non-zero.
func RunStarter(args []string) error {
	// The thread that moves is the one that becomes the command.
	runtime.LockOSThread()
	if len(args) < 8 || args[5] != "--" {
		return ErrStarterUsage
	}
	errFD, err := strconv.Atoi(args[0])
	if err != nil || errFD < 3 {
		return fmt.Errorf("%w: ERRFD %q is not a descriptor above 2", ErrStarterUsage, args[0])
	}
	fail := func(err error) error {
		_, _ = unix.Write(errFD, []byte(err.Error()))
		return err
	}
	n, err := strconv.Atoi(args[1])
	if err != nil || n < 1 || n > 16 {
		return fail(fmt.Errorf("COUNT %q is not a number of cgroups", args[1]))
	}
	for fd := errFD + 1; fd <= errFD+n; fd++ {
		if _, err := unix.Write(fd, []byte("0")); err != nil {
			return fail(fmt.Errorf("moving into the cgroup of descriptor %d: %w", fd, err))
		}
		if err := unix.Close(fd); err != nil {
			return fail(fmt.Errorf("closing descriptor %d: %w", fd, err))
		}
	}
	if args[2] != "-" {
		uid, err1 := strconv.ParseUint(args[2], 10, 32)
		gid, err2 := strconv.ParseUint(args[3], 10, 32)
		if err1 != nil || err2 != nil {
			return fail(fmt.Errorf("ids %q and %q are not numbers", args[2], args[3]))
		}
		var groups []uint32
		if args[4] != "" {
			for _, s := range strings.Split(args[4], ",") {
				g, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					return fail(fmt.Errorf("group %q is not a number", s))
				}
				groups = append(groups, uint32(g))
			}
		}
		// Groups first, then the group, then the user: after that no
		// privilege is left to change the others. On this thread only:
		// it is the one that becomes the command (the exec ends the
		// others, which run nothing but Go's runtime), and changing every
		// thread's ids stops each of them three times.
		if err := threadSetgroups(groups); err != nil {
			return fail(fmt.Errorf("setting the supplementary groups: %w", err))
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			return fail(fmt.Errorf("taking gid %d: %w", gid, e))
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			return fail(fmt.Errorf("taking uid %d: %w", uid, e))
		}
	}
	if _, err := unix.FcntlInt(uintptr(errFD), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fail(fmt.Errorf("marking descriptor %d close-on-exec: %w", errFD, err))
	}
	err = syscall.Exec(args[6], args[7:], os.Environ())
	return fail(fmt.Errorf("exec %s: %w", args[6], err))
}

// threadSetgroups sets the calling thread's supplementary groups.
func threadSetgroups(groups []uint32) error {
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return e
	}
	return nil
}
