package procstat

import (
	"os"
	"testing"
)

func TestParseCountsFromTheLastParenthesis(t *testing.T) {
	st, err := parse("4242 (a) b) (c) S 17 4242 4242 0 -1 4194560 100 0 0 0 31 7 0 0 20 0 1 0 99 1000 10\n")
	if err != nil {
		t.Fatal(err)
	}
	if st.Comm != "a) b) (c" || st.PPid != 17 || st.UTime != 31 || st.STime != 7 {
		t.Errorf("parsed %+v, want comm %q, ppid 17, utime 31, stime 7", st, "a) b) (c")
	}
	for _, bad := range []string{"", "4242 no parentheses S 1", "4242 (x) S 1 2", "4242 (x) S ppid 1 1 0 -1 0 0 0 0 0 31 7"} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) succeeded", bad)
		}
	}
}

func TestReadSeesThisProcess(t *testing.T) {
	st, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPid != os.Getppid() {
		t.Errorf("ppid %d, want %d", st.PPid, os.Getppid())
	}
}
