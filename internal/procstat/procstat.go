// Package procstat reads the fields of /proc/<pid>/stat the project uses.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is what /proc/<pid>/stat says of a process.
type Stat struct {
	// Comm is the command name (at most 15 bytes, any of them).
	Comm string
	// PPid is the parent's pid, as the reader's pid namespace sees it.
	PPid int
	// UTime and STime are user and system CPU time, in clock ticks.
	UTime, STime uint64
}

// Read parses /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return parse(string(b))
}

func parse(s string) (Stat, error) {
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Stat{}, fmt.Errorf("unexpected /proc stat line %q", s)
	}
	f := strings.Fields(s[closing+1:])
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return Stat{}, fmt.Errorf("unexpected /proc stat line %q", s)
	}
	st := Stat{Comm: s[open+1 : closing]}
	var errs [3]error
	st.PPid, errs[0] = strconv.Atoi(f[1])
	st.UTime, errs[1] = strconv.ParseUint(f[11], 10, 64)
	st.STime, errs[2] = strconv.ParseUint(f[12], 10, 64)
	for _, err := range errs {
		if err != nil {
			return Stat{}, fmt.Errorf("unexpected /proc stat line %q: %w", s, err)
		}
	}
	return st, nil
}
