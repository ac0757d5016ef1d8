package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "an escaping link is refused" {
				if err := os.Symlink(outside, filepath.Join(areasRoot, "ada", "workspace", "out")); err != nil {
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
}
