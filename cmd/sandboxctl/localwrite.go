package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// writeLocal replaces the host file dst with what src holds, at most
// maxCopy bytes, as one step: the bytes go to a new file beside dst, which
// is renamed over dst only once all of them are there. A copy that fails
// part way (a stream cut, Ctrl-C, a file larger than the limit) leaves dst
// as it was and no part file behind. The file's size and contents come
// from the sandbox, so neither is trusted to be small. dst's directory is
// opened once and everything is done in it: a link at dst is replaced, not
// written through, and an existing regular file keeps its permission bits.
func writeLocal(dst string, src io.Reader) (err error) {
	d, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer d.Close()
	dfd, base := int(d.Fd()), filepath.Base(dst)
	mode, keepMode := uint32(0o666), false // less the umask, as os.Create makes it
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT == unix.S_IFREG:
		mode, keepMode = st.Mode&0o777, true
	case st.Mode&unix.S_IFMT != unix.S_IFLNK:
		return fmt.Errorf("%s is not a regular file", dst)
	}
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	part := "." + base + ".part-" + hex.EncodeToString(suffix)
	fd, err := unix.Openat(dfd, part, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("creating a part file beside %s: %w", dst, err)
	}
	out := os.NewFile(uintptr(fd), part)
	defer func() {
		if err != nil {
			out.Close()
			_ = unix.Unlinkat(dfd, part, 0)
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
		if err := out.Chmod(fs.FileMode(mode)); err != nil {
			return err
		}
	}
	if err := out.Close(); err != nil {
		return err
	}
	return unix.Renameat(dfd, part, dfd, base)
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
