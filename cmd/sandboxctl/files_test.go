package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

func TestCopyAndListThroughContainedAccess(t *testing.T) {
	dir := t.TempDir()
	areasRoot := filepath.Join(dir, "areas")
	cfg := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(cfg, []byte("backend = \"bwrap\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(local, []byte("agent notes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--config", cfg, "--agent", "ada", "--areas-root", areasRoot}
	// A copy that fails leaves the file it would have replaced as it was.
	kept := filepath.Join(dir, "kept.txt")
	if err := os.WriteFile(kept, []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A name the agent chose to forge a second entry and clear the
	// terminal of whoever lists it.
	const hostile = "a\n-rw-r--r--  0  2026-01-01 00:00  b\x1b[2J"

	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{"copy in to a directory", append(append([]string{"cp"}, flags...), local, ":/workspace/"), 0, "", ""},
		{"list shows it", append(append([]string{"ls"}, flags...), "/workspace"), 0, "notes.txt", ""},
		{"copy out", append(append([]string{"cp"}, flags...), ":/workspace/notes.txt", filepath.Join(dir, "back.txt")), 0, "", ""},
		{"blocks refuse writes", append(append([]string{"cp"}, flags...), local, ":/blocks/notes.txt"), exitFailed, "", "read-only"},
		{"an escaping link is refused", append(append([]string{"cp"}, flags...), ":/workspace/out/secret", filepath.Join(dir, "stolen")), exitFailed, "", "escapes"},
		{"both sides local", append(append([]string{"cp"}, flags...), local, filepath.Join(dir, "x")), exitUsage, "", "exactly one"},
		{"a file past the limit is refused", append(append([]string{"cp"}, flags...), ":/workspace/huge", kept), exitFailed, "", "limit of one copy"},
		{"names are shown quoted, one entry a line", append(append([]string{"ls"}, flags...), "/workspace"), 0, strconv.Quote(hostile), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			workspace := filepath.Join(areasRoot, "ada", "workspace")
			switch tc.name {
			case "an escaping link is refused":
				if err := os.Symlink(outside, filepath.Join(workspace, "out")); err != nil {
					t.Fatal(err)
				}
			case "a file past the limit is refused":
				// The agent makes a sparse file one byte past the limit.
				f, err := os.Create(filepath.Join(workspace, "huge"))
				if err == nil {
					err = f.Truncate(maxCopy + 1)
					f.Close()
				}
				if err != nil {
					t.Fatal(err)
				}
			case "names are shown quoted, one entry a line":
				if err := os.WriteFile(filepath.Join(workspace, hostile), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			code, out, stderr := sandboxctl(t, "", tc.args...)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) || !strings.Contains(stderr, tc.wantErr) {
				t.Fatalf("exit %d stdout %q stderr %q; want exit %d, stdout with %q, stderr with %q", code, out, stderr, tc.wantCode, tc.wantOut, tc.wantErr)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(dir, "back.txt")); err != nil || string(b) != "agent notes\n" {
		t.Fatalf("round trip: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "stolen")); !os.IsNotExist(err) {
		t.Fatalf("a file was copied out through an escaping link: %v", err)
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "kept\n" {
		t.Fatalf("the file a refused copy would have replaced: %q, %v", b, err)
	}
	code, out, _ := sandboxctl(t, "", append(append([]string{"ls"}, flags...), "/workspace")...)
	entries, err := os.ReadDir(filepath.Join(areasRoot, "ada", "workspace"))
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || strings.Contains(out, "\x1b") || strings.Count(out, "\n") != len(entries) {
		t.Fatalf("ls printed a name raw (%d entries):\n%s", len(entries), out)
	}
}

// A copy out of the sandbox that fails part way leaves the host file it
// was replacing as it was, and nothing of its own behind.
func TestWriteLocalReplacesAFileWhole(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "report.md")
	if err := os.WriteFile(dst, []byte("the user's report\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	cut := io.MultiReader(strings.NewReader("the first half of a"), iotest.ErrReader(io.ErrUnexpectedEOF))
	if err := writeLocal(dst, cut); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut stream: %v, want the stream's error", err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "the user's report\n" {
		t.Fatalf("after a cut stream the file holds %q (%v), want it as it was", b, err)
	}
	if err := writeLocal(dst, strings.NewReader("new\n")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if b, _ := os.ReadFile(dst); err != nil || string(b) != "new\n" || fi.Mode().Perm() != 0o640 {
		t.Fatalf("a whole copy: %q, mode %v, %v; want \"new\\n\" keeping mode 0640", b, fi.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("the directory holds %d entries, want the file alone: %v", len(entries), entries)
	}

	// A link at the destination is replaced, never written through.
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("another file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := writeLocal(link, strings.NewReader("copied\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "another file\n" {
		t.Fatalf("the copy was written through a link to %q", b)
	}
	if fi, err := os.Lstat(link); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the link was not replaced by the copy: %v, %v", fi, err)
	}
}

// changeLinePattern is one file change as diff prints it.
var changeLinePattern = regexp.MustCompile(`^[AMD] file +0[0-7]{3} sha256:[0-9a-f]{64} [^ ]+$`)

func TestDiffAndApplyAnOverlayMount(t *testing.T) {
	needBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (overlay mounts need CAP_SYS_ADMIN)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a.txt"), []byte("orig\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The agent runs as its own unprivileged id: it may change the source
	// in its overlay only where the source's modes let it.
	if err := os.Chmod(src, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "a.txt"), 0o666); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, dir, "[[mounts]]\nsource = \""+src+"\"\ntarget = \"project\"\nmode = \"overlay\"\n[bwrap]\nbinaries = [\"sh\"]\n")
	flags := []string{"--config", cfg, "--agent", "ov", "--areas-root", filepath.Join(dir, "areas")}
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"run"}, flags...), "--", "sh", "-ec", "echo new > project/a.txt; echo b > project/b.txt")...); code != 0 {
		t.Fatalf("run: exit %d, %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "a.txt")); string(b) != "orig\n" {
		t.Fatalf("the source changed before apply: %q", b)
	}
	code, out, stderr := sandboxctl(t, "", append(append([]string{"diff"}, flags...), "project")...)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 3 || !changeLinePattern.MatchString(lines[0]) || !strings.HasPrefix(lines[0], "M ") || !strings.HasSuffix(lines[0], " a.txt") ||
		!changeLinePattern.MatchString(lines[1]) || !strings.HasPrefix(lines[1], "A ") || !strings.HasPrefix(lines[2], "digest sha256:") {
		t.Fatalf("diff: exit %d stdout %q stderr %q", code, out, stderr)
	}
	reviewed := strings.TrimPrefix(lines[2], "digest ")
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"apply"}, flags...), "project")...); code != exitUsage || !strings.Contains(stderr, "--digest is required") {
		t.Fatalf("apply without a digest: exit %d, %s", code, stderr)
	}

	// The sandbox changes its upper layer after the review: apply refuses
	// and writes nothing.
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"run"}, flags...), "--", "sh", "-ec", "echo evil > project/a.txt")...); code != 0 {
		t.Fatalf("run: exit %d, %s", code, stderr)
	}
	code, _, stderr = sandboxctl(t, "", append(append([]string{"apply"}, flags...), "--digest", reviewed, "project")...)
	if code != exitFailed || !strings.Contains(stderr, "differ from the reviewed ones") {
		t.Fatalf("apply after a change: exit %d, %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "a.txt")); string(b) != "orig\n" {
		t.Fatalf("a refused apply wrote a.txt: %q", b)
	}
	if _, err := os.Stat(filepath.Join(src, "b.txt")); !os.IsNotExist(err) {
		t.Fatalf("a refused apply wrote b.txt: %v", err)
	}

	if code, _, stderr := sandboxctl(t, "", append(append([]string{"run"}, flags...), "--", "sh", "-ec", "echo new > project/a.txt")...); code != 0 {
		t.Fatalf("run: exit %d, %s", code, stderr)
	}
	code, out, stderr = sandboxctl(t, "", append(append([]string{"diff"}, flags...), "project")...)
	if code != 0 || !strings.Contains(out, "digest "+reviewed) {
		t.Fatalf("the same changes must give the same digest: exit %d stdout %q stderr %q", code, out, stderr)
	}
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"apply"}, flags...), "--digest", reviewed, "project")...); code != 0 {
		t.Fatalf("apply: exit %d, %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "a.txt")); string(b) != "new\n" {
		t.Fatalf("after apply a.txt = %q", b)
	}
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"diff"}, flags...), "missing")...); code != exitFailed || !strings.Contains(stderr, "no mount") {
		t.Fatalf("diff of an unknown target: exit %d, %s", code, stderr)
	}
}

// A copy out to a host directory the sandbox can write (below a read-write
// mount's source) meets the agent's links on its way there: the agent
// chooses where they lead, so the copy is refused rather than written
// wherever a link points. The user's own links elsewhere still lead.
func TestCopyOutNeverFollowsTheAgentsLinksOnTheWay(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "project")
	if err := os.MkdirAll(filepath.Join(src, "build"), 0o777); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, dir, "[[mounts]]\nsource = \""+src+"\"\ntarget = \"project\"\nmode = \"rw\"\n")
	flags := []string{"--config", cfg, "--agent", "ada", "--areas-root", filepath.Join(dir, "areas")}
	local := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(local, []byte("from the sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"cp"}, flags...), local, ":/workspace/notes.txt")...); code != 0 {
		t.Fatalf("copy in: exit %d, %s", code, stderr)
	}
	// What the agent makes through its mount: a directory of the project
	// that is a link to a host directory it cannot reach.
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(src, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../outside", filepath.Join(src, "build", "up")); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{
		filepath.Join(src, "out") + "/",
		filepath.Join(src, "out", "notes.txt"),
		filepath.Join(src, "build", "up", "x.txt"),
	} {
		code, _, stderr := sandboxctl(t, "", append(append([]string{"cp"}, flags...), ":/workspace/notes.txt", dst)...)
		if code != exitFailed || !strings.Contains(stderr, "link") {
			t.Errorf("copy out to %s: exit %d, %s", dst, code, stderr)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("a copy out was written through the agent's link: %v", entries)
	}
	// The project's own directories, and the user's links outside what
	// the sandbox can write, are destinations as before.
	mine := filepath.Join(dir, "mine")
	if err := os.Symlink(src, mine); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{filepath.Join(src, "build") + "/", filepath.Join(mine, "build", "b.txt"), filepath.Join(dir, "c.txt")} {
		if code, _, stderr := sandboxctl(t, "", append(append([]string{"cp"}, flags...), ":/workspace/notes.txt", dst)...); code != 0 {
			t.Fatalf("copy out to %s: exit %d, %s", dst, code, stderr)
		}
	}
	for _, p := range []string{filepath.Join(src, "build", "notes.txt"), filepath.Join(src, "build", "b.txt"), filepath.Join(dir, "c.txt")} {
		if b, err := os.ReadFile(p); err != nil || string(b) != "from the sandbox\n" {
			t.Fatalf("%s: %q, %v", p, b, err)
		}
	}
	// A link at the destination itself is replaced, as before.
	if err := os.Symlink(filepath.Join(outside, "z.txt"), filepath.Join(src, "build", "z.txt")); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"cp"}, flags...), ":/workspace/notes.txt", filepath.Join(src, "build", "z.txt"))...); code != 0 {
		t.Fatalf("copy out over a link: exit %d, %s", code, stderr)
	}
	if fi, err := os.Lstat(filepath.Join(src, "build", "z.txt")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the link at the destination was not replaced: %v, %v", fi, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("a copy out was written through the agent's link: %v", entries)
	}
}

// A copy into the sandbox from a host directory the sandbox can write
// reads what the agent put there: a link it made to a host file, or on
// the way to one, is refused, never read (sandboxctl often runs as
// root), and a FIFO it made does not hold the copy.
func TestCopyInNeverReadsThroughTheAgentsLinks(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "project")
	if err := os.MkdirAll(src, 0o777); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, dir, "[[mounts]]\nsource = \""+src+"\"\ntarget = \"project\"\nmode = \"rw\"\n")
	flags := []string{"--config", cfg, "--agent", "ada", "--areas-root", filepath.Join(dir, "areas")}
	secrets := filepath.Join(dir, "secrets")
	if err := os.Mkdir(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "key"), []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What the agent makes through its mount.
	if err := os.Symlink(filepath.Join(secrets, "key"), filepath.Join(src, "input.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secrets, filepath.Join(src, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{"input.txt", "sub/key", "fifo"} {
		done := make(chan struct{})
		var code int
		var stderr string
		go func() {
			defer close(done)
			code, _, stderr = sandboxctl(t, "", append(append([]string{"cp"}, flags...), filepath.Join(src, from), ":/workspace/"+strings.ReplaceAll(from, "/", "-"))...)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("copy in of %s hangs", from)
		}
		if code != exitFailed {
			t.Errorf("copy in of %s: exit %d, %s", from, code, stderr)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "areas", "ada", "workspace"))
	for _, e := range entries {
		if b, _ := os.ReadFile(filepath.Join(dir, "areas", "ada", "workspace", e.Name())); strings.Contains(string(b), "secret") {
			t.Fatalf("a host file was copied into the sandbox as %s", e.Name())
		}
	}
	// The project's own files, and the user's links outside what the
	// sandbox can write, are sources as before.
	if err := os.WriteFile(filepath.Join(src, "own.txt"), []byte("own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(dir, "mine")
	if err := os.Symlink(src, mine); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := sandboxctl(t, "", append(append([]string{"cp"}, flags...), filepath.Join(mine, "own.txt"), ":/workspace/own.txt")...); code != 0 {
		t.Fatalf("copy in of own.txt: exit %d, %s", code, stderr)
	}
}
