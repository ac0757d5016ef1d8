//go:build linux

package areas

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func TestStage(t *testing.T) {
	cases := []struct {
		name    string
		path    string
		parents bool
		commit  bool
		// check is where the content must land (relative to the root) after
		// a commit; absent lists what must not exist afterwards.
		check   string
		absent  []string
		wantErr error
	}{
		{name: "commit puts the file in place", path: "new.txt", commit: true, check: "new.txt"},
		{name: "commit replaces a link instead of writing through it", path: "absout", commit: true, check: "absout"},
		{name: "commit through an in-root directory link", path: "dirlink/new", commit: true, check: "dir/new"},
		{name: "commit creates missing parents", path: "a/b/c.txt", parents: true, commit: true, check: "a/b/c.txt"},
		{name: "abort leaves nothing", path: "new.txt", absent: []string{"new.txt"}},
		{name: "abort leaves no parent directory", path: "a/b/c.txt", parents: true, absent: []string{"a"}},
		{name: "missing parent without parents", path: "nope/new", wantErr: fs.ErrNotExist},
		{name: "parent through an escaping link", path: "absdir/new", parents: true, wantErr: ErrEscape},
		{name: "parent through an escaping relative link", path: "dir/esc/new", wantErr: ErrEscape},
		{name: "missing parent beyond dotdot", path: "nope/../../x", parents: true, wantErr: fs.ErrNotExist},
		{name: "the root itself", path: "", wantErr: ErrInvalidPath},
		{name: "trailing slash", path: "x/", wantErr: ErrInvalidPath},
		{name: "NUL", path: "a\x00b", wantErr: ErrInvalidPath},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t)
			before := tt.outsideState(t)
			s, err := tt.r.Stage(c.path, 0o640, c.parents)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("want %v, got %v", c.wantErr, err)
				}
				assertNoTempFiles(t, tt.tmp)
				tt.assertOutsideUnchanged(t, before)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write([]byte("staged ")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write([]byte(c.name)); err != nil {
				t.Fatal(err)
			}
			if c.commit {
				if err := s.Commit(); err != nil {
					t.Fatal(err)
				}
				s.Abort() // after a commit: nothing to do
				fi, err := os.Lstat(filepath.Join(tt.root, c.check))
				if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640 {
					t.Fatalf("%s: want a regular file with mode 0640, got %v, %v", c.check, fi, err)
				}
				if b, _ := os.ReadFile(filepath.Join(tt.root, c.check)); string(b) != "staged "+c.name {
					t.Fatalf("%s holds %q", c.check, b)
				}
			} else {
				s.Abort()
				s.Abort()
				if err := s.Commit(); err == nil {
					t.Fatal("a commit after abort must fail")
				}
			}
			for _, p := range c.absent {
				if _, err := os.Lstat(filepath.Join(tt.root, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after abort: %v", p, err)
				}
			}
			assertNoTempFiles(t, tt.tmp)
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

// A directory replaced by a link to the outside between Stage and Commit
// must not be descended into when the missing parents are made.
func TestStageCommitRefusesALinkSwappedInForAParent(t *testing.T) {
	tt := newTree(t)
	before := tt.outsideState(t)
	s, err := tt.r.Stage("made/new.txt", 0o644, true)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.Symlink(filepath.Join(tt.tmp, "outside"), filepath.Join(tt.root, "made")))
	if err := s.Commit(); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
		t.Fatalf("want the link refused, got %v", err)
	}
	assertNoTempFiles(t, tt.tmp)
	tt.assertOutsideUnchanged(t, before)
}

func TestStageChownThroughTheDescriptor(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (chown to another user)", "run the tests as root, as CI does")
	}
	tt := newTree(t)
	s, err := tt.r.Stage("owned", 0o644, false)
	if err != nil {
		t.Fatal(err)
	}
	must(t, s.Chown(4321, 4322))
	must(t, s.Commit())
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(tt.root, "owned"), &st))
	if st.Uid != 4321 || st.Gid != 4322 {
		t.Fatalf("owner %d:%d, want 4321:4322", st.Uid, st.Gid)
	}
}

func TestStageReadOnlyRootRefused(t *testing.T) {
	tt := newTree(t)
	ro, err := OpenRoot("/blocks", tt.root, true)
	must(t, err)
	if _, err := ro.Stage("x", 0o644, true); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("want ErrReadOnly, got %v", err)
	}
}
