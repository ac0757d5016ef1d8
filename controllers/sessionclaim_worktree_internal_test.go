package controllers

import "testing"

func TestStatusDirty(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		dirty     bool
		err       bool
	}{
		{name: "clean", out: "# branch.oid 4f2304e1\n# branch.head s2\n"},
		{name: "clean, detached", out: "# branch.oid 4f2304e1\n# branch.head (detached)\n"},
		{name: "untracked file", out: "# branch.oid 4f2304e1\n# branch.head s2\n? draft.txt\n", dirty: true},
		{name: "changed file", out: "# branch.oid 4f2304e1\n# branch.head s2\n1 .M N... 100644 100644 100644 ce01 ce01 README\n", dirty: true},
		{name: "changes whatever came of the header", out: "? draft.txt\n", dirty: true},
		{name: "nothing at all", out: "", err: true},
		{name: "headers but not the branch's", out: "# branch.head s2\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirty, err := statusDirty(tc.out)
			if dirty != tc.dirty || (err != nil) != tc.err {
				t.Fatalf("statusDirty(%q) = %v, %v; want dirty %v, error %v", tc.out, dirty, err, tc.dirty, tc.err)
			}
		})
	}
}
