package runtimes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// CheckMountSources checks that the host source of every custom mount (the
// lower layer of an overlay mount) is a directory a sandbox can bind: it
// exists, it is a directory, and resolving it ends (no symbolic-link loop).
// Every backend binds by path when the instance starts or a command runs,
// so a missing source would otherwise leave an instance that reports
// running while every command fails. The error, when not nil, is an *Error
// with ReasonMountSourceMissing naming each mount, its source and what is
// wrong with it.
//
// The git directories of session worktrees (Bind.GitDir) are not checked:
// they are opened through handles and left out when gone, and the claims
// report their health.
func CheckMountSources(in Instance) error {
	var problems []string
	for _, b := range in.Mounts {
		if b.GitDir {
			continue
		}
		src := b.Source
		if b.Overlay != nil {
			src = b.Overlay.Lower
		}
		if p := sourceProblem(src); p != "" {
			problems = append(problems, fmt.Sprintf("mount %s: source %s %s", b.Target, src, p))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return Errorf(ReasonMountSourceMissing, "checking mount sources of", in.Name, "%s", strings.Join(problems, "; "))
}

// sourceProblem says what keeps path from being bound as a directory, or ""
// when nothing does. It follows links as the bind will.
func sourceProblem(path string) string {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return ""
	case err == nil:
		return fmt.Sprintf("is not a directory (it is a %s)", kindOf(fi.Mode()))
	case errors.Is(err, unix.ELOOP):
		return "is a symbolic link loop (too many levels of symbolic links)"
	case errors.Is(err, unix.ENOTDIR):
		return "does not exist (a parent of it is not a directory)"
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	default:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Sprintf("cannot be checked: %v", err)
	}
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	default:
		return "special file"
	}
}
