//go:build unix

package areas

import (
	"io/fs"
	"syscall"
)

// ownedBy says whether fi (nil: just made) belongs to owner as user and
// group.
func ownedBy(fi fs.FileInfo, owner uint32) bool {
	if fi == nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == owner && st.Gid == owner
}
