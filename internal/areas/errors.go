package areas

import (
	"errors"
	"fmt"
)

// ErrEscape is matched (errors.Is) by every *EscapeError.
var ErrEscape = errors.New("path escapes its root")

// ErrUnsupportedPlatform is wrapped when openat2(2) is unavailable. There is
// deliberately no fallback: checking paths in user space is exactly the
// race this package exists to avoid.
var ErrUnsupportedPlatform = fmt.Errorf("contained file access needs openat2(2): Linux 5.6 or newer is required: %w", errors.ErrUnsupported)

// ErrReadOnly is wrapped when a write, mkdir or remove targets a read-only
// root.
var ErrReadOnly = errors.New("the root is read-only")

// ErrRootReplaced is wrapped when a root's host path no longer leads to the
// directory recorded when the root was opened: it was removed, renamed
// away, or replaced (for instance by a symbolic link to somewhere else).
var ErrRootReplaced = errors.New("the root was replaced: its host path no longer leads to the directory registered")

// ErrInvalidPath is wrapped when a path is malformed for the operation
// (absolute where a relative path is needed, contains NUL, names the root
// or ".." where an entry is needed).
var ErrInvalidPath = errors.New("invalid path")

// EscapeError reports a path that resolves outside its root. Callers should
// treat it as a refusal (HTTP 403), not as a missing file.
type EscapeError struct {
	// Op says what was being done: "reading", "writing", ...
	Op string
	// Path is the path as given, relative to the root.
	Path string
	// Root is the root's name (its sandbox mount point for a View).
	Root string
	// RootPath is the root's host directory. It is kept out of Error so
	// that messages shown to an agent do not disclose the host layout.
	RootPath string
	// Err is the kernel's answer (EXDEV).
	Err error
}

func (e *EscapeError) Error() string {
	return fmt.Sprintf("%s %q: the path escapes root %q: symbolic links with absolute targets, links leading outside the root and \"..\" above the root are refused", e.Op, e.Path, e.Root)
}

// Is lets errors.Is(err, ErrEscape) match without callers needing As.
func (e *EscapeError) Is(target error) bool { return target == ErrEscape }

func (e *EscapeError) Unwrap() error { return e.Err }

// MaxListEntries bounds List: a directory of more entries is refused.
const MaxListEntries = 100_000

// ErrTooManyEntries is wrapped when a directory holds more entries than a
// listing reads.
var ErrTooManyEntries = errors.New("more entries than a listing reads")

// maxRemoveDepth bounds the directories a recursive remove descends.
const maxRemoveDepth = 256

// ErrTooDeep is wrapped when a recursive remove meets a tree deeper than
// it descends.
var ErrTooDeep = fmt.Errorf("more than %d directories deep", maxRemoveDepth)
