package execapi

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fuzzSecret = "host secret the agent must never see"

// FuzzFilePaths throws arbitrary areas and paths (.., links, NUL, very long
// names) at the file endpoints, straight at the handler so that nothing
// cleans them first. Whatever the request: nothing outside the areas and
// mounts is read, written or removed, the areas and mounts themselves stay,
// the answer never discloses a host path, and a bad path is the caller's
// error (4xx), not the server's.
func FuzzFilePaths(f *testing.F) {
	long := strings.Repeat("n", 300)
	for _, seed := range []struct {
		method byte
		area   string
		path   string
	}{
		{0, "workspace", "out/secret"},
		{0, "workspace", "rel/secret"},
		{0, "workspace", "proc/secret"},
		{1, "workspace", "out/secret"},
		{1, "workspace", "reldir/new"},
		{2, "workspace", "out/secret"},
		{2, "workspace", "out"},
		{2, "workspace", ""},
		{2, "workspace", "docs"},
		{2, "workspace", "docs/readme"},
		{1, "blocks", "x"},
		{0, "workspace", "../../../../etc/passwd"},
		{0, "workspace", "../memories/note"},
		{1, "workspace", "../../outside/secret"},
		{2, "memories", "../../outside/secret"},
		{0, "..", "outside/secret"},
		{0, "workspace", "a\x00b"},
		{1, "workspace", "a\x00/../../outside/secret"},
		{1, "workspace", long},
		{1, "workspace", long + "/" + long},
		{0, "workspace", strings.Repeat("a/", 2100)},
		{1, "workspace", strings.Repeat("../", 40) + "outside/secret"},
		{0, "workspace", "loop/x"},
		{1, "workspace", "dir/"},
		{1, "workspace", "%2e%2e/outside/secret"},
		{0, "workspace", "docs/../../outside/secret"},
	} {
		f.Add(seed.method, seed.area, seed.path)
	}
	f.Fuzz(func(t *testing.T, method byte, area, p string) {
		fx := newFixture(t, Config{MaxBodyBytes: 1 << 10})
		outside := t.TempDir()
		ws := fx.workspace()
		agentDir := filepath.Join(fx.areas, fx.agent)
		for _, d := range []string{"workspace", "memories", "blocks", "skills", "tasks"} {
			if err := os.MkdirAll(filepath.Join(agentDir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for name, content := range map[string]string{
			filepath.Join(outside, "secret"):            fuzzSecret,
			filepath.Join(ws, "dir", "file"):            "in the workspace",
			filepath.Join(agentDir, "memories", "note"): "a memory",
			filepath.Join(agentDir, "blocks", "block"):  "read-only block",
			filepath.Join(fx.roMount, "readme"):         "read-only mount",
		} {
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for link, target := range map[string]string{
			"out":    outside,
			"reldir": "../../../" + filepath.Base(filepath.Dir(outside)) + "/" + filepath.Base(outside),
			"rel":    strings.Repeat("../", strings.Count(ws, "/")) + strings.TrimPrefix(outside, "/"),
			"proc":   "/proc/self/root" + outside,
			"loop":   "loop",
		} {
			if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
				t.Fatal(err)
			}
		}
		before := tree(t, outside)
		blocks := tree(t, filepath.Join(agentDir, "blocks"))
		ro := tree(t, fx.roMount)

		methods := []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodHead}
		m := methods[int(method)%len(methods)]
		req := &http.Request{
			Method: m,
			URL:    &url.URL{Path: "/api/v1alpha1/namespaces/" + ns + "/sessionclaims/s1/files/fuzz", RawQuery: "recursive=true"},
			Header: http.Header{"Authorization": {"Bearer alice-token"}},
			Body:   http.NoBody,
		}
		if m == http.MethodPut {
			req.Body = httpBody("written by the fuzzer")
			req.ContentLength = int64(len("written by the fuzzer"))
		}
		req = req.WithContext(t.Context())
		req.SetPathValue("namespace", ns)
		req.SetPathValue("name", "s1")
		req.SetPathValue("area", area)
		req.SetPathValue("path", p)
		rec := httptest.NewRecorder()
		fx.api.serveFiles(rec, req)

		body := rec.Body.String()
		if strings.Contains(body, fuzzSecret) {
			t.Fatalf("%s %.120q %.200q read the file outside: %d %q", m, area, p, rec.Code, body)
		}
		for _, hostPath := range []string{fx.areas, outside, fx.roMount} {
			if strings.Contains(body, hostPath) {
				t.Fatalf("%s %.120q %.200q: the answer discloses host path %s: %q", m, area, p, hostPath, body)
			}
		}
		if rec.Code >= 500 {
			t.Fatalf("%s %.120q %.200q: a bad path is the caller's error, got %d %q", m, area, p, rec.Code, body)
		}
		if got := tree(t, outside); got != before {
			t.Fatalf("%s %.120q %.200q changed the directory outside:\n%s\nwas\n%s", m, area, p, got, before)
		}
		if got := tree(t, filepath.Join(agentDir, "blocks")); got != blocks {
			t.Fatalf("%s %.120q %.200q changed the read-only blocks area", m, area, p)
		}
		if got := tree(t, fx.roMount); got != ro {
			t.Fatalf("%s %.120q %.200q changed the read-only mount", m, area, p)
		}
		for _, d := range []string{"workspace", "memories", "blocks", "skills", "tasks"} {
			if fi, err := os.Lstat(filepath.Join(agentDir, d)); err != nil || !fi.IsDir() {
				t.Fatalf("%s %.120q %.200q removed or replaced area %s: %v", m, area, p, d, err)
			}
		}
	})
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func httpBody(s string) readCloser { return readCloser{bytes.NewReader([]byte(s))} }

// tree records every entry below dir, its kind and a file's content.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			b.WriteString(p + " error " + err.Error() + "\n")
			return nil //nolint:nilerr // an unreadable entry is recorded in the listing
		}
		b.WriteString(p + " " + d.Type().String())
		if d.Type().IsRegular() {
			c, _ := os.ReadFile(p)
			b.WriteString(" " + string(c))
		}
		b.WriteString("\n")
		return nil
	})
	return b.String()
}
