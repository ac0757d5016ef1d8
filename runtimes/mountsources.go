package runtimes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// CheckMountSources checks that the host source of every custom mount (the
// lower layer of an overlay mount) is a directory a sandbox can bind: it
// exists, it is a directory, and resolving it beneath its anchor ends there
// (no link out, no magic link, no symbolic-link loop, not /proc or /sys).
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
		src := in.SourceDir(b)
		if b.Overlay != nil {
			src = b.Overlay.LowerDir()
		}
		if p := sourceProblem(src); p != "" {
			problems = append(problems, fmt.Sprintf("mount %s: source %s %s", b.Target, src.Path, p))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return Errorf(ReasonMountSourceMissing, "checking mount sources of", in.Name, "%s", strings.Join(problems, "; "))
}

// sourceProblem says what keeps d from being bound as a directory, or ""
// when nothing does. It resolves d as every bind does (areas.HostDir).
func sourceProblem(d areas.HostDir) string {
	f, err := d.Open()
	if err == nil {
		f.Close()
		return ""
	}
	var pe *fs.PathError
	switch {
	case errors.Is(err, areas.ErrEscape), errors.Is(err, areas.ErrPseudoFS), errors.Is(err, areas.ErrOutsideAnchor):
		return fmt.Sprintf("is refused: %v", err)
	case errors.Is(err, unix.ELOOP):
		return fmt.Sprintf("cannot be resolved: %v", err)
	case errors.Is(err, unix.ENOTDIR):
		if fi, serr := os.Lstat(d.Path); serr == nil && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return fmt.Sprintf("is not a directory (it is a %s)", kindOf(fi.Mode()))
		}
		return "is not a directory, or a parent of it is not one"
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	case errors.As(err, &pe):
		return fmt.Sprintf("cannot be checked: %v", pe.Err)
	default:
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
