//go:build linux

package areas

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// escapeCase is one path read through the root. Exactly one of want,
// wantEscape and wantErr is set.
type escapeCase struct {
	name string
	path string
	// want is the content the read must return.
	want       string
	wantEscape bool
	wantErr    error
	// retarget, when set, points the link "later" here after a first
	// successful read; the same path must then be refused.
	retarget   string
	extraNodes []node
}

var escapeCases = []escapeCase{
	// In-root relative links and ".." that stay inside must work.
	{name: "plain file", path: "file0", want: "file0"},
	{name: "file in directory", path: "dir/file", want: "in-dir"},
	{name: "relative link inside root", path: "inlink", want: "in-dir"},
	{name: "directory link inside root", path: "dirlink/sub/deep", want: "deep"},
	{name: "chain of links inside root", path: "chain1", want: "in-dir"},
	{name: "link with dotdot staying inside", path: "dir/up", want: "file0"},
	{name: "link to parent staying inside", path: "dir/uplink/file0", want: "file0"},
	{name: "dotdot staying inside", path: "dir/sub/../../file0", want: "file0"},
	{name: "dot components", path: "./dir/./file", want: "in-dir"},
	{name: "doubled slashes", path: "dir//file", want: "in-dir"},

	// Absolute link targets are refused even when they lead into the root.
	{name: "absolute link to outside file", path: "absout", wantEscape: true},
	{name: "absolute link to outside dir", path: "absdir/secret", wantEscape: true},
	{name: "absolute link into the root itself", path: "absin", wantEscape: true},

	// ".." chains above the root.
	{name: "dotdot to parent", path: "..", wantEscape: true},
	{name: "dotdot chain to outside", path: "../../outside/secret", wantEscape: true},
	{name: "dotdot chain from a subdirectory", path: "dir/../../../outside/secret", wantEscape: true},
	{name: "long dotdot chain to host", path: "../../../../../../../../etc/hostname", wantEscape: true},
	{name: "dotdot after an inside link", path: "dirlink/../../../outside/secret", wantEscape: true},

	// Relative links that leave the root.
	{name: "relative link to outside file", path: "relout", wantEscape: true},
	{name: "relative link to outside dir", path: "reldir/secret", wantEscape: true},
	{name: "nested relative link leaving root", path: "dir/esc/secret", wantEscape: true},
	{name: "link into a sibling area", path: "sibling", wantEscape: true},
	{name: "link to a sibling area directory", path: "siblingdir/note", wantEscape: true},

	// /proc links: absolute, and magic besides.
	{name: "link to proc self root", path: "proc/etc/hostname", wantEscape: true, extraNodes: hostLinks},
	{name: "link to proc self cwd", path: "proccwd/root_linux_test.go", wantEscape: true, extraNodes: hostLinks},
	{name: "link through proc self root to outside", path: "procout", wantEscape: true},
	{name: "absolute link to etc", path: "etc/hostname", wantEscape: true, extraNodes: hostLinks},

	// Links that are fine when first used and are swapped afterwards.
	{name: "link fine at check time then retargeted absolute", path: "later/file", want: "in-dir", retarget: "@TMP@/outside"},
	{name: "link fine at check time then retargeted relative", path: "later/file", want: "in-dir", retarget: "../../outside"},
	{name: "link fine at check time then retargeted to sibling", path: "later/file", want: "in-dir", retarget: "../memories"},

	// Not escapes, but must fail cleanly.
	{name: "symlink loop", path: "loop1", wantErr: unix.ELOOP},
	{name: "missing file", path: "dir/nope", wantErr: fs.ErrNotExist},
	{name: "absolute input", path: "/etc/hostname", wantErr: ErrInvalidPath},
	{name: "absolute input naming the root", path: tmpPlaceholder + "/agent/workspace/file0", wantErr: ErrInvalidPath},
	{name: "NUL byte", path: "file0\x00x", wantErr: ErrInvalidPath},
}

// tmpPlaceholder keeps the table static; it is an absolute path, which is
// what matters for the case that uses it.
const tmpPlaceholder = "/tmp/placeholder"

func checkEscapeResult(t *testing.T, tt *testTree, c escapeCase, got string, err error) {
	t.Helper()
	switch {
	case c.wantEscape:
		var esc *EscapeError
		if !errors.As(err, &esc) || !errors.Is(err, ErrEscape) {
			t.Fatalf("want an *EscapeError, got content %q, error %v", got, err)
		}
		if esc.Root != tt.r.Name() || esc.RootPath != tt.root || esc.Path == "" {
			t.Fatalf("escape error does not name the path and the root: %+v", esc)
		}
		if !strings.Contains(err.Error(), "escapes root") || !strings.Contains(err.Error(), esc.Path) {
			t.Fatalf("escape message %q does not say the path escapes", err)
		}
	case c.wantErr != nil:
		if !errors.Is(err, c.wantErr) {
			t.Fatalf("want error %v, got content %q, error %v", c.wantErr, got, err)
		}
		if errors.Is(err, ErrEscape) {
			t.Fatalf("unexpected escape error: %v", err)
		}
	default:
		if err != nil {
			t.Fatalf("want %q, got error %v", c.want, err)
		}
		if got != c.want {
			t.Fatalf("want %q, got %q", c.want, got)
		}
	}
}

func TestEscapeAttempts(t *testing.T) {
	for _, c := range escapeCases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t, c.extraNodes)
			before := tt.outsideState(t)

			b, err := tt.r.Read(c.path)
			checkEscapeResult(t, tt, c, string(b), err)

			_, err = tt.r.Stat(c.path)
			checkEscapeResult(t, tt, escapeCase{want: "", wantEscape: c.wantEscape, wantErr: c.wantErr}, "", err)

			f, err := tt.r.Open(c.path)
			if err == nil {
				assertBeneath(t, tt, int(f.Fd()))
				f.Close()
			}
			checkEscapeResult(t, tt, escapeCase{wantEscape: c.wantEscape, wantErr: c.wantErr}, "", err)

			if c.retarget != "" {
				link := filepath.Join(tt.root, "later")
				if err := os.Remove(link); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(strings.ReplaceAll(c.retarget, "@TMP@", tt.tmp), link); err != nil {
					t.Fatal(err)
				}
				b, err := tt.r.Read(c.path)
				checkEscapeResult(t, tt, escapeCase{wantEscape: true}, string(b), err)
				if err := tt.r.Write(c.path, []byte("x"), 0o644); !errors.Is(err, ErrEscape) {
					t.Fatalf("write through the retargeted link: want an escape error, got %v", err)
				}
			}
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

// writeEscapeCases are paths whose parent directory escapes, so creating
// anything there must be refused.
var writeEscapeCases = []struct{ name, path string }{
	{"absolute link to outside dir", "absdir/new"},
	{"relative link to outside dir", "reldir/new"},
	{"dotdot chain", "../../outside/new"},
	{"nested relative link leaving root", "dir/esc/new"},
	{"link into a sibling area", "siblingdir/new"},
	{"link through proc self root", "procoutdir/new"},
	{"dotdot after an inside link", "dirlink/../../new"},
}

func TestWriteEscapeAttempts(t *testing.T) {
	for _, c := range writeEscapeCases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t)
			before := tt.outsideState(t)
			var esc *EscapeError
			if err := tt.r.Write(c.path, []byte("x"), 0o644); !errors.As(err, &esc) || esc.Path != c.path || esc.Op != "writing" {
				t.Errorf("Write: want an escape error naming %q, got %v", c.path, err)
			}
			if err := tt.r.Mkdir(c.path, false); !errors.Is(err, ErrEscape) {
				t.Errorf("Mkdir: want an escape error, got %v", err)
			}
			if err := tt.r.Mkdir(c.path+"/a/b", true); !errors.Is(err, ErrEscape) {
				t.Errorf("Mkdir with parents: want an escape error, got %v", err)
			}
			if err := tt.r.Remove(c.path, true); !errors.Is(err, ErrEscape) {
				t.Errorf("Remove: want an escape error, got %v", err)
			}
			if _, err := tt.r.List(filepath.Dir(c.path)); !errors.Is(err, ErrEscape) {
				t.Errorf("List: want an escape error, got %v", err)
			}
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

// assertBeneath checks, through the kernel's own record of the open file,
// that fd is inside the root.
func assertBeneath(t testing.TB, tt *testTree, fd int) {
	t.Helper()
	real, err := filepath.EvalSymlinks(tt.root)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	if got != real && !strings.HasPrefix(got, real+"/") {
		t.Fatalf("opened %s, which is not beneath the root %s", got, real)
	}
}

func TestRootReplaced(t *testing.T) {
	cases := []struct {
		name    string
		replace func(t *testing.T, root, elsewhere string)
	}{
		{"renamed away and replaced by a symlink", func(t *testing.T, root, elsewhere string) {
			must(t, os.Rename(root, root+".moved"))
			must(t, os.Symlink(elsewhere, root))
		}},
		{"renamed away and replaced by a relative symlink", func(t *testing.T, root, elsewhere string) {
			must(t, os.Rename(root, root+".moved"))
			must(t, os.Symlink("../outside", root))
		}},
		{"renamed away and replaced by another directory", func(t *testing.T, root, elsewhere string) {
			must(t, os.Rename(root, root+".moved"))
			must(t, os.Mkdir(root, 0o755))
			must(t, os.WriteFile(filepath.Join(root, "file0"), []byte("impostor"), 0o644))
		}},
		{"parent directory replaced by a symlink", func(t *testing.T, root, elsewhere string) {
			agent := filepath.Dir(root)
			must(t, os.Rename(agent, agent+".moved"))
			must(t, os.MkdirAll(filepath.Join(elsewhere, "workspace"), 0o755))
			must(t, os.MkdirAll(filepath.Join(elsewhere, "memories"), 0o755))
			must(t, os.Symlink(elsewhere, agent))
		}},
		{"removed", func(t *testing.T, root, elsewhere string) {
			must(t, os.RemoveAll(root))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t)
			if _, err := tt.r.Read("file0"); err != nil {
				t.Fatalf("first access: %v", err)
			}
			c.replace(t, tt.root, tt.outside)
			before := tt.outsideState(t)
			checks := map[string]error{}
			_, checks["Read"] = tt.r.Read("secret")
			_, checks["Stat"] = tt.r.Stat(".")
			_, checks["List"] = tt.r.List(".")
			checks["Write"] = tt.r.Write("new", []byte("x"), 0o644)
			checks["Mkdir"] = tt.r.Mkdir("newdir", true)
			checks["Remove"] = tt.r.Remove("secret", false)
			for op, err := range checks {
				if !errors.Is(err, ErrRootReplaced) {
					t.Errorf("%s: want ErrRootReplaced, got %v", op, err)
					continue
				}
				if !strings.Contains(err.Error(), "root was replaced") {
					t.Errorf("%s: message %q does not say the root was replaced", op, err)
				}
			}
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

func TestOpenRootRefuses(t *testing.T) {
	tt := newTree(t)
	cases := []struct{ name, path, want string }{
		{"relative host path", "agent/workspace", "not absolute"},

		{"regular file", filepath.Join(tt.root, "file0"), "not a directory"},
		{"missing", filepath.Join(tt.root, "nope"), "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := OpenRoot("x", c.path, false)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error containing %q, got %v", c.want, err)
			}
		})
	}
}

// A root an agent can reach from above is opened with NoLinks: a link at
// its place is refused, not followed.
func TestOpenRootAtWithoutLinksRefusesALinkedRoot(t *testing.T) {
	tt := newTree(t)
	_, err := OpenRootAt("x", HostDir{Anchor: filepath.Dir(tt.root), Path: filepath.Join(tt.root, "dirlink"), NoLinks: true}, false)
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("want a refusal naming the symbolic link, got %v", err)
	}
}

func enosys(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }

func TestNoOpenat2ENOSYS(t *testing.T) {
	t.Run("at registration", func(t *testing.T) {
		saved := defaultSys
		defaultSys = sysCalls{openat2: enosys}
		t.Cleanup(func() { defaultSys = saved })
		_, err := OpenRoot("/workspace", t.TempDir(), false)
		if !errors.Is(err, ErrUnsupportedPlatform) || !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("want ErrUnsupportedPlatform, got %v", err)
		}
		if !strings.Contains(err.Error(), "Linux 5.6 or newer is required") {
			t.Fatalf("message %q does not name the kernel requirement", err)
		}
	})
	t.Run("blocked by seccomp at registration", func(t *testing.T) {
		saved := defaultSys
		defaultSys = sysCalls{openat2: func(int, string, *unix.OpenHow) (int, error) { return -1, unix.EPERM }}
		t.Cleanup(func() { defaultSys = saved })
		if _, err := OpenRoot("/workspace", t.TempDir(), false); !errors.Is(err, ErrUnsupportedPlatform) {
			t.Fatalf("want ErrUnsupportedPlatform, got %v", err)
		}
	})
	t.Run("at access", func(t *testing.T) {
		tt := newTree(t)
		tt.r.sys.openat2 = enosys
		before := tt.outsideState(t)
		checks := map[string]error{}
		_, checks["Read"] = tt.r.Read("file0")
		_, checks["Stat"] = tt.r.Stat("file0")
		_, checks["List"] = tt.r.List(".")
		checks["Write"] = tt.r.Write("new", []byte("x"), 0o644)
		checks["Mkdir"] = tt.r.Mkdir("a/b", true)
		checks["Remove"] = tt.r.Remove("file0", false)
		for op, err := range checks {
			if !errors.Is(err, ErrUnsupportedPlatform) {
				t.Errorf("%s: want ErrUnsupportedPlatform, got %v", op, err)
			}
		}
		if _, err := os.Stat(filepath.Join(tt.root, "file0")); err != nil {
			t.Fatalf("file0 was touched without openat2: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(tt.root, "new")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a file was written without openat2: %v", err)
		}
		tt.assertOutsideUnchanged(t, before)
	})
}

func TestWriteAtomic(t *testing.T) {
	cases := []struct {
		name    string
		path    string
		perm    os.FileMode
		check   string // where the content must land, relative to the root
		wantErr error
		// keepLink: the link at path must be replaced, not written through.
		linkTarget string
	}{
		{name: "new file", path: "new.txt", perm: 0o644, check: "new.txt"},
		{name: "replaces existing file", path: "file0", perm: 0o600, check: "file0"},
		{name: "in subdirectory", path: "dir/sub/new", perm: 0o640, check: "dir/sub/new"},
		{name: "through in-root directory link", path: "dirlink/new", perm: 0o644, check: "dir/new"},
		{name: "replaces a link instead of writing through it", path: "inlink", perm: 0o644, check: "inlink", linkTarget: "dir/file"},
		{name: "replaces an escaping link without touching its target", path: "absout", perm: 0o644, check: "absout"},
		{name: "exact mode regardless of umask", path: "exec", perm: 0o777, check: "exec"},
		{name: "missing parent", path: "nope/new", perm: 0o644, wantErr: fs.ErrNotExist},
		{name: "onto a directory", path: "dir", perm: 0o644, wantErr: syscall.EISDIR},
		{name: "trailing slash", path: "new/", perm: 0o644, wantErr: ErrInvalidPath},
		{name: "the root itself", path: "", perm: 0o644, wantErr: ErrInvalidPath},
		{name: "dotdot as the name", path: "dir/..", perm: 0o644, wantErr: ErrInvalidPath},
		{name: "absolute", path: "/tmp/x", perm: 0o644, wantErr: ErrInvalidPath},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t)
			before := tt.outsideState(t)
			data := []byte("written by " + c.name)
			err := tt.r.Write(c.path, data, c.perm)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("want %v, got %v", c.wantErr, err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				host := filepath.Join(tt.root, c.check)
				fi, err := os.Lstat(host)
				if err != nil {
					t.Fatal(err)
				}
				if !fi.Mode().IsRegular() || fi.Mode().Perm() != c.perm {
					t.Fatalf("want a regular file with mode %v, got %v", c.perm, fi.Mode())
				}
				if got, _ := os.ReadFile(host); string(got) != string(data) {
					t.Fatalf("want %q, got %q", data, got)
				}
				if c.linkTarget != "" {
					if got, _ := os.ReadFile(filepath.Join(tt.root, c.linkTarget)); string(got) == string(data) {
						t.Fatalf("the write went through the link to %s", c.linkTarget)
					}
				}
			}
			assertNoTempFiles(t, tt.tmp)
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

func TestWriteReadOnlyRootRefused(t *testing.T) {
	tt := newTree(t)
	ro, err := OpenRoot("/blocks", tt.root, true)
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, tt.root)
	checks := map[string]error{
		"Write":  ro.Write("file0", []byte("x"), 0o644),
		"Mkdir":  ro.Mkdir("newdir", true),
		"Remove": ro.Remove("file0", false),
	}
	for op, err := range checks {
		if !errors.Is(err, ErrReadOnly) || !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), "/blocks") {
			t.Errorf("%s: want a read-only error naming the root, got %v", op, err)
		}
	}
	if diff, ok := sameSnapshot(before, snapshot(t, tt.root)); !ok {
		t.Fatalf("read-only root changed: %s", diff)
	}
	if b, err := ro.Read("file0"); err != nil || string(b) != "file0" {
		t.Fatalf("reading a read-only root: %q, %v", b, err)
	}
}

func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	for p := range snapshot(t, dir) {
		if strings.Contains(filepath.Base(p), ".areas-write-") {
			t.Fatalf("temporary file left behind: %s", p)
		}
	}
}

func TestList(t *testing.T) {
	tt := newTree(t)
	must(t, os.Chmod(filepath.Join(tt.root, "dir", "file"), 0o640))
	ents, err := tt.r.List("dir")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Entry{}
	var names []string
	for _, e := range ents {
		got[e.Name] = e
		names = append(names, e.Name)
	}
	if want := []string{"esc", "file", "sub", "up", "uplink"}; !slices.Equal(names, want) {
		t.Fatalf("want names %v sorted, got %v", want, names)
	}
	if e := got["file"]; e.Type != TypeFile || e.Size != int64(len("in-dir")) || e.Mode != 0o640 || e.ModTime.IsZero() {
		t.Errorf("file: %+v", e)
	}
	if e := got["sub"]; e.Type != TypeDir || !e.IsDir() || e.Mode&fs.ModeDir == 0 {
		t.Errorf("sub: %+v", e)
	}
	// Links are listed as links, including ones that escape: listing does
	// not follow them.
	if e := got["esc"]; e.Type != TypeSymlink || e.Mode&fs.ModeSymlink == 0 {
		t.Errorf("esc: %+v", e)
	}

	t.Run("root", func(t *testing.T) {
		for _, p := range []string{"", ".", "./"} {
			ents, err := tt.r.List(p)
			if err != nil || len(ents) == 0 {
				t.Fatalf("List(%q): %d entries, %v", p, len(ents), err)
			}
		}
	})
	t.Run("through in-root link", func(t *testing.T) {
		ents, err := tt.r.List("dirlink")
		if err != nil || len(ents) != 5 {
			t.Fatalf("%d entries, %v", len(ents), err)
		}
	})
	t.Run("a file", func(t *testing.T) {
		if _, err := tt.r.List("file0"); !errors.Is(err, syscall.ENOTDIR) {
			t.Fatalf("want ENOTDIR, got %v", err)
		}
	})
	t.Run("escaping link", func(t *testing.T) {
		if _, err := tt.r.List("absdir"); !errors.Is(err, ErrEscape) {
			t.Fatalf("want an escape error, got %v", err)
		}
	})
}

func TestStatAndLstat(t *testing.T) {
	tt := newTree(t)
	cases := []struct {
		name      string
		path      string
		lstat     bool
		wantName  string
		wantType  EntryType
		wantSize  int64
		wantError error
	}{
		{"file", "dir/file", false, "file", TypeFile, 6, nil},
		{"root", "", false, ".", TypeDir, -1, nil},
		{"directory", "dir/sub/", false, "sub", TypeDir, -1, nil},
		{"stat follows an in-root link", "inlink", false, "inlink", TypeFile, 6, nil},
		{"lstat shows the link", "inlink", true, "inlink", TypeSymlink, int64(len("dir/file")), nil},
		{"lstat of an escaping link is allowed", "absout", true, "absout", TypeSymlink, -1, nil},
		{"stat of an escaping link is refused", "absout", false, "", "", 0, ErrEscape},
		{"lstat through an escaping directory link is refused", "absdir/secret", true, "", "", 0, ErrEscape},
		{"lstat of dotdot is refused", "..", true, "", "", 0, ErrEscape},
		{"missing", "nope", false, "", "", 0, fs.ErrNotExist},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stat := tt.r.Stat
			if c.lstat {
				stat = tt.r.Lstat
			}
			e, err := stat(c.path)
			if c.wantError != nil {
				if !errors.Is(err, c.wantError) {
					t.Fatalf("want %v, got %+v, %v", c.wantError, e, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Name != c.wantName || e.Type != c.wantType || (c.wantSize >= 0 && e.Size != c.wantSize) {
				t.Fatalf("got %+v", e)
			}
		})
	}
}

func TestOpenRefusesNonRegularFiles(t *testing.T) {
	tt := newTree(t)
	must(t, unix.Mkfifo(filepath.Join(tt.root, "fifo"), 0o644))
	cases := []struct{ name, path string }{
		{"fifo, which would block", "fifo"},
		{"directory", "dir"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tt.r.Read(c.path)
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Fatalf("want a not-a-regular-file error, got %v", err)
			}
		})
	}
	t.Run("open streams a regular file", func(t *testing.T) {
		f, err := tt.r.Open("chain1")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil || string(b) != "in-dir" {
			t.Fatalf("%q, %v", b, err)
		}
	})
}

func TestMkdir(t *testing.T) {
	cases := []struct {
		name    string
		path    string
		parents bool
		wantDir string // relative to the root
		wantErr error
	}{
		{name: "single", path: "newdir", wantDir: "newdir"},
		{name: "inside an existing directory", path: "dir/new", wantDir: "dir/new"},
		{name: "missing parent without parents", path: "a/b/c", wantErr: fs.ErrNotExist},
		{name: "existing without parents", path: "dir", wantErr: fs.ErrExist},
		{name: "parents", path: "a/b/c", parents: true, wantDir: "a/b/c"},
		{name: "parents through in-root link", path: "dirlink/x/y", parents: true, wantDir: "dir/x/y"},
		{name: "parents with dotdot staying inside", path: "dir/../p/q", parents: true, wantDir: "p/q"},
		{name: "parents on existing", path: "dir/sub", parents: true, wantDir: "dir/sub"},
		{name: "parents on the root", path: ".", parents: true, wantDir: "."},
		{name: "parents through a file", path: "file0/x", parents: true, wantErr: syscall.ENOTDIR},
		{name: "parents through escaping link", path: "absdir/x/y", parents: true, wantErr: ErrEscape},
		{name: "parents through dotdot", path: "../x", parents: true, wantErr: ErrEscape},
		{name: "parents through relative link leaving root", path: "dir/esc/x", parents: true, wantErr: ErrEscape},
		{name: "root without parents", path: "", wantErr: ErrInvalidPath},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t)
			before := tt.outsideState(t)
			err := tt.r.Mkdir(c.path, c.parents)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("want %v, got %v", c.wantErr, err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				fi, err := os.Lstat(filepath.Join(tt.root, c.wantDir))
				if err != nil || !fi.IsDir() {
					t.Fatalf("want a directory at %s: %v, %v", c.wantDir, fi, err)
				}
			}
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

func TestRemove(t *testing.T) {
	cases := []struct {
		name      string
		path      string
		recursive bool
		gone      []string // relative to the root
		kept      []string // relative to the root
		wantErr   error
	}{
		{name: "file", path: "file0", gone: []string{"file0"}},
		{name: "empty directory", path: "empty", gone: []string{"empty"}},
		{name: "link, not its target", path: "inlink", gone: []string{"inlink"}, kept: []string{"dir/file"}},
		{name: "escaping link, not its target", path: "absout", gone: []string{"absout"}},
		{name: "non-empty directory without recursive", path: "dir", wantErr: syscall.ENOTEMPTY, kept: []string{"dir/file"}},
		{name: "recursive", path: "dir", recursive: true, gone: []string{"dir"}, kept: []string{"file0"}},
		{name: "recursive on a link to a directory removes the link only", path: "dirlink", recursive: true, gone: []string{"dirlink"}, kept: []string{"dir/file", "dir/sub/deep"}},
		{name: "inside an in-root link", path: "dirlink/file", gone: []string{"dir/file"}},
		{name: "missing", path: "nope", wantErr: fs.ErrNotExist},
		{name: "the root", path: "", recursive: true, wantErr: ErrInvalidPath, kept: []string{"file0"}},
		{name: "the root as dot", path: ".", recursive: true, wantErr: ErrInvalidPath, kept: []string{"file0"}},
		{name: "dotdot", path: "dir/..", recursive: true, wantErr: ErrInvalidPath, kept: []string{"file0"}},
		{name: "through an escaping link", path: "absdir/secret", wantErr: ErrEscape},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tt := newTree(t)
			before := tt.outsideState(t)
			err := tt.r.Remove(c.path, c.recursive)
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Fatalf("want %v, got %v", c.wantErr, err)
			}
			if c.wantErr == nil && err != nil {
				t.Fatal(err)
			}
			for _, p := range c.gone {
				if _, err := os.Lstat(filepath.Join(tt.root, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s still exists (%v)", p, err)
				}
			}
			for _, p := range c.kept {
				if _, err := os.Lstat(filepath.Join(tt.root, p)); err != nil {
					t.Errorf("%s was removed: %v", p, err)
				}
			}
			tt.assertOutsideUnchanged(t, before)
		})
	}
}

// TestRemoveRecursiveDoesNotFollowLinksOutside fills a tree with links to
// the outside directory and the sibling area, at several depths, and checks
// a recursive remove deletes the links and nothing they lead to.
func TestRemoveRecursiveDoesNotFollowLinksOutside(t *testing.T) {
	tt := newTree(t, []node{
		{path: "agent/workspace/victim/absdir", link: "@TMP@/outside"},
		{path: "agent/workspace/victim/a/reldir", link: "../../../../outside"},
		{path: "agent/workspace/victim/a/b/sibling", link: "../../../../memories"},
		{path: "agent/workspace/victim/a/b/proc", link: "/proc/self/root@TMP@/outside"},
		{path: "agent/workspace/victim/a/b/file", content: "x"},
		{path: "outside/sub/deeper", content: "keep"},
	})
	before := tt.outsideState(t)
	if err := tt.r.Remove("victim", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(tt.root, "victim")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("victim still exists: %v", err)
	}
	tt.assertOutsideUnchanged(t, before)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
