//go:build linux

package areas

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Marker contents: finding one of these through a root means an escape.
const (
	outsideSecret = "OUTSIDE-SECRET"
	siblingSecret = "SIBLING-SECRET"
)

// node is one entry of a test tree. In link targets, @TMP@ stands for the
// test's temporary directory and @ROOT@ for the root.
type node struct {
	path, content, link string
	dir                 bool
}

// baseTree is the agent layout every escape test starts from. The root is
// <tmp>/agent/workspace; <tmp>/agent/memories is a sibling area and
// <tmp>/outside is what no access may ever reach.
var baseTree = []node{
	{path: "agent/workspace/file0", content: "file0"},
	{path: "agent/workspace/dir/file", content: "in-dir"},
	{path: "agent/workspace/dir/sub/deep", content: "deep"},
	{path: "agent/workspace/inlink", link: "dir/file"},
	{path: "agent/workspace/dirlink", link: "dir"},
	{path: "agent/workspace/chain1", link: "chain2"},
	{path: "agent/workspace/chain2", link: "dirlink/file"},
	{path: "agent/workspace/dir/up", link: "../file0"},
	{path: "agent/workspace/dir/uplink", link: ".."},
	{path: "agent/workspace/later", link: "dir"},
	{path: "agent/workspace/absout", link: "@TMP@/outside/secret"},
	{path: "agent/workspace/absdir", link: "@TMP@/outside"},
	{path: "agent/workspace/absin", link: "@ROOT@/file0"},
	{path: "agent/workspace/relout", link: "../../outside/secret"},
	{path: "agent/workspace/reldir", link: "../../outside"},
	{path: "agent/workspace/dir/esc", link: "../../../outside"},
	{path: "agent/workspace/sibling", link: "../memories/note"},
	{path: "agent/workspace/siblingdir", link: "../memories"},
	{path: "agent/workspace/procout", link: "/proc/self/root@TMP@/outside/secret"},
	{path: "agent/workspace/procoutdir", link: "/proc/self/root@TMP@/outside"},
	{path: "agent/workspace/loop1", link: "loop2"},
	{path: "agent/workspace/loop2", link: "loop1"},
	{path: "agent/workspace/empty", dir: true},
	{path: "agent/memories/note", content: siblingSecret},
	{path: "outside/secret", content: outsideSecret},
}

// hostLinks lead to the whole host file system. They are only used with
// reads: a test running as root must not be able to write to the host even
// if the code under test regressed.
var hostLinks = []node{
	{path: "agent/workspace/proc", link: "/proc/self/root"},
	{path: "agent/workspace/proccwd", link: "/proc/self/cwd"},
	{path: "agent/workspace/etc", link: "/etc"},
}

type testTree struct {
	tmp, root, outside, sibling string
	r                           *Root
}

func buildTree(t testing.TB, tmp string, nodes ...[]node) *testTree {
	t.Helper()
	tt := &testTree{
		tmp:     tmp,
		root:    filepath.Join(tmp, "agent", "workspace"),
		outside: filepath.Join(tmp, "outside"),
		sibling: filepath.Join(tmp, "agent", "memories"),
	}
	for _, dir := range []string{tt.root, tt.outside, tt.sibling} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, list := range nodes {
		for _, n := range list {
			p := filepath.Join(tmp, n.path)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			var err error
			switch {
			case n.dir:
				err = os.Mkdir(p, 0o755)
			case n.link != "":
				target := strings.ReplaceAll(n.link, "@TMP@", tmp)
				target = strings.ReplaceAll(target, "@ROOT@", tt.root)
				err = os.Symlink(target, p)
			default:
				err = os.WriteFile(p, []byte(n.content), 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := OpenRoot("/workspace", tt.root, false)
	if err != nil {
		t.Fatal(err)
	}
	tt.r = r
	return tt
}

func newTree(t testing.TB, nodes ...[]node) *testTree {
	t.Helper()
	return buildTree(t, t.TempDir(), append([][]node{baseTree}, nodes...)...)
}

// snapshot records every entry below dir: its kind and, for files, the
// contents; for links, the target. It compares whole trees in one go.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "link:" + target
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = "file:" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(a, b map[string]string) (string, bool) {
	var diffs []string
	for k, v := range a {
		if b[k] != v {
			diffs = append(diffs, k+": "+v+" -> "+b[k])
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, k+": new "+v)
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; "), len(diffs) == 0
}

// outsideState is everything an access through the root must leave alone:
// the outside directory, the sibling area and what sits beside the root.
func (tt *testTree) outsideState(t testing.TB) map[string]string {
	t.Helper()
	s := map[string]string{}
	for k, v := range snapshot(t, tt.outside) {
		s["outside/"+k] = v
	}
	for k, v := range snapshot(t, tt.sibling) {
		s["memories/"+k] = v
	}
	for _, dir := range []string{tt.tmp, filepath.Dir(tt.root)} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			s["entry:"+filepath.Join(dir, e.Name())] = e.Type().String()
		}
	}
	return s
}

func (tt *testTree) assertOutsideUnchanged(t testing.TB, before map[string]string) {
	t.Helper()
	if diff, ok := sameSnapshot(before, tt.outsideState(t)); !ok {
		t.Fatalf("something outside the root changed: %s", diff)
	}
}
