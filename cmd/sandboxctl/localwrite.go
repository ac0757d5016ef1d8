package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// writeLocal replaces the host file dst with what src holds, at most
// maxCopy bytes, as one step: the bytes go to a new file beside dst, which
// is renamed over dst only once all of them are there. A copy that fails
// part way (a stream cut, Ctrl-C, a file larger than the limit) leaves dst
// as it was and no part file behind. The file's size and contents come
// from the sandbox, so neither is trusted to be small. An existing dst keeps
// its permission bits; a link as dst is followed, as cp follows it.
func writeLocal(dst string, src io.Reader) (err error) {
	if target, err := filepath.EvalSymlinks(dst); err == nil {
		dst = target
	}
	mode := fs.FileMode(0o666) // less the umask, as os.Create makes it
	keepMode := false
	if fi, err := os.Stat(dst); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", dst)
		}
		mode, keepMode = fi.Mode().Perm(), true
	}
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	part := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".part-"+hex.EncodeToString(suffix))
	out, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(part)
		}
	}()
	n, err := io.Copy(out, io.LimitReader(src, maxCopy+1))
	if err != nil {
		return err
	}
	if n > maxCopy {
		return errTooLarge
	}
	if keepMode {
		if err := out.Chmod(mode); err != nil {
			return err
		}
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(part, dst)
}

// errTooLarge is a copy past the limit of one copy.
var errTooLarge = fmt.Errorf("more than the %d-byte limit of one copy", maxCopy)

// tooLarge says whether a copy of size bytes passes the limit.
func tooLarge(size int64) error {
	if size > maxCopy {
		return fmt.Errorf("%d bytes is %w", size, errTooLarge)
	}
	return nil
}

// displayName is a file name as a terminal may show it: quoted, with its
// control characters escaped, when it holds any (or is not UTF-8, or
// begins with a quote). Names come from the sandbox: one with a newline
// would print as two entries, one with an escape sequence would command
// the terminal.
func displayName(name string) string {
	if strings.HasPrefix(name, `"`) || !utf8.ValidString(name) {
		return strconv.Quote(name)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return strconv.Quote(name)
		}
	}
	return name
}
