//go:build linux

package areas

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// agentView lays out an agent the way the runtimes do and opens its view:
// the five standard areas plus mounts at /workspace/project (rw) and
// /workspace/docs/ref (ro).
func agentView(t *testing.T) (*View, string) {
	t.Helper()
	tmp := t.TempDir()
	agent := filepath.Join(tmp, "areas", "agent")
	var bs []Binding
	for _, a := range []struct {
		name string
		ro   bool
	}{{"workspace", false}, {"memories", false}, {"blocks", true}, {"skills", false}, {"tasks", false}} {
		must(t, os.MkdirAll(filepath.Join(agent, a.name), 0o755))
		bs = append(bs, Binding{Target: "/" + a.name, Dir: HostDir{Path: filepath.Join(agent, a.name)}, ReadOnly: a.ro})
	}
	for _, m := range []string{"project", "ref"} {
		must(t, os.MkdirAll(filepath.Join(tmp, "src", m), 0o755))
	}
	bs = append(bs,
		Binding{Target: "/workspace/project", Dir: HostDir{Path: filepath.Join(tmp, "src", "project")}},
		Binding{Target: "/workspace/docs/ref", Dir: HostDir{Path: filepath.Join(tmp, "src", "ref")}, ReadOnly: true},
	)
	v, err := OpenView(bs, Identity{})
	if err != nil {
		t.Fatal(err)
	}
	return v, tmp
}

func TestViewResolve(t *testing.T) {
	v, _ := agentView(t)
	cases := []struct {
		path     string
		wantRoot string
		wantRel  string
		wantRO   bool
		wantErr  error
	}{
		{path: "/workspace", wantRoot: "/workspace", wantRel: "."},
		{path: "/workspace/", wantRoot: "/workspace", wantRel: "."},
		{path: "/workspace/a/b", wantRoot: "/workspace", wantRel: "a/b"},
		{path: "/workspace/project", wantRoot: "/workspace/project", wantRel: "."},
		{path: "/workspace/project/x/y", wantRoot: "/workspace/project", wantRel: "x/y"},
		{path: "/workspace/projectx/y", wantRoot: "/workspace", wantRel: "projectx/y"},
		{path: "/workspace/docs/x", wantRoot: "/workspace", wantRel: "docs/x"},
		{path: "/workspace/docs/ref/x", wantRoot: "/workspace/docs/ref", wantRel: "x", wantRO: true},
		{path: "/workspace/project/../x", wantRoot: "/workspace", wantRel: "x"},
		{path: "/workspace/a/../project/z", wantRoot: "/workspace/project", wantRel: "z"},
		{path: "/memories/a", wantRoot: "/memories", wantRel: "a"},
		{path: "/blocks/b", wantRoot: "/blocks", wantRel: "b", wantRO: true},
		{path: "/skills/s/SKILL.md", wantRoot: "/skills", wantRel: "s/SKILL.md"},
		{path: "/tasks//t", wantRoot: "/tasks", wantRel: "t"},
		{path: "/etc/passwd", wantErr: ErrNoRoot},
		{path: "/", wantErr: ErrNoRoot},
		{path: "/workspace/../etc/passwd", wantErr: ErrNoRoot},
		{path: "/memoriesx", wantErr: ErrNoRoot},
		{path: "workspace/a", wantErr: ErrInvalidPath},
		{path: "", wantErr: ErrInvalidPath},
		{path: "/workspace/a\x00b", wantErr: ErrInvalidPath},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			r, rel, err := v.Resolve(c.path)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("want %v, got %v (%v, %q)", c.wantErr, err, r, rel)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Name() != c.wantRoot || rel != c.wantRel || r.ReadOnly() != c.wantRO {
				t.Fatalf("want %s %q ro=%v, got %s %q ro=%v", c.wantRoot, c.wantRel, c.wantRO, r.Name(), rel, r.ReadOnly())
			}
		})
	}
}

func TestViewReadOnlyRootsRefuseWrites(t *testing.T) {
	v, _ := agentView(t)
	for _, p := range []string{"/blocks/x", "/workspace/docs/ref/x"} {
		r, rel, err := v.Resolve(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Write(rel, []byte("x"), 0o644); !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s: want ErrReadOnly, got %v", p, err)
		}
	}
	r, rel, err := v.Resolve("/workspace/project/x")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(rel, []byte("x"), 0o644); err != nil {
		t.Fatalf("rw mount: %v", err)
	}
}

func TestViewAddRefuses(t *testing.T) {
	v, tmp := agentView(t)
	r, err := OpenRoot("extra", filepath.Join(tmp, "src", "project"), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/workspace", "relative", "/", "/a/../b", "/a/"} {
		if err := v.Add(p, r); err == nil {
			t.Errorf("Add(%q) succeeded", p)
		}
	}
}

func TestHostPathIsLexical(t *testing.T) {
	v, tmp := agentView(t)
	agent := filepath.Join(tmp, "areas", "agent")
	// A link that leads out of the area: HostPath must not resolve it.
	must(t, os.Symlink("/etc", filepath.Join(agent, "workspace", "link")))
	cases := []struct {
		path, want string
		wantErr    error
	}{
		{path: "/workspace/a/b", want: filepath.Join(agent, "workspace", "a", "b")},
		{path: "/workspace", want: filepath.Join(agent, "workspace")},
		{path: "/memories/m.md", want: filepath.Join(agent, "memories", "m.md")},
		{path: "/blocks/b", want: filepath.Join(agent, "blocks", "b")},
		{path: "/workspace/project/src/main.go", want: filepath.Join(tmp, "src", "project", "src", "main.go")},
		{path: "/workspace/a/../b", want: filepath.Join(agent, "workspace", "b")},
		{path: "/workspace/link/passwd", want: filepath.Join(agent, "workspace", "link", "passwd")},
		{path: "/workspace/missing/file", want: filepath.Join(agent, "workspace", "missing", "file")},
		{path: "/workspace/../../etc", wantErr: ErrNoRoot},
		{path: "x", wantErr: ErrInvalidPath},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			got, err := v.HostPath(c.path)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("want %v, got %q, %v", c.wantErr, got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("want %q, got %q, %v", c.want, got, err)
			}
			if strings.HasPrefix(got, "/etc") {
				t.Fatalf("HostPath resolved a link: %q", got)
			}
		})
	}
}
