package runtimes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/overlay"
)

func TestCheckMountSources(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	file := filepath.Join(dir, "file")
	loop := filepath.Join(dir, "loop")
	linkToGood := filepath.Join(dir, "link-to-good")
	if err := os.Mkdir(good, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(good, linkToGood); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		bind   Bind
		wantOK bool
		want   string
	}{
		{name: "directory", bind: Bind{Source: good, Target: "/workspace/a"}, wantOK: true},
		{name: "link to a directory", bind: Bind{Source: linkToGood, Target: "/workspace/a"}, wantOK: true},
		{name: "missing", bind: Bind{Source: filepath.Join(dir, "gone"), Target: "/workspace/a"},
			want: "mount /workspace/a: source " + filepath.Join(dir, "gone") + " does not exist"},
		{name: "regular file", bind: Bind{Source: file, Target: "/workspace/a"},
			want: "source " + file + " is not a directory (it is a regular file)"},
		{name: "symlink loop", bind: Bind{Source: loop, Target: "/workspace/a"},
			want: "source " + loop + " cannot be resolved: host directory " + loop + ": a symbolic link loop"},
		{name: "below a file", bind: Bind{Source: filepath.Join(file, "sub"), Target: "/workspace/a"},
			want: "is not a directory, or a parent of it is not one"},
		{name: "overlay checks its lower layer", bind: Bind{Source: filepath.Join(dir, "merged-not-made-yet"), Target: "/workspace/a",
			Overlay: &overlay.Layers{Lower: good}}, wantOK: true},
		{name: "overlay with a missing lower layer", bind: Bind{Source: good, Target: "/workspace/a",
			Overlay: &overlay.Layers{Lower: filepath.Join(dir, "gone")}}, want: "source " + filepath.Join(dir, "gone") + " does not exist"},
		{name: "git directories are not checked", bind: Bind{Source: filepath.Join(dir, "gone"), Target: "/repo/.git", GitDir: true}, wantOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMountSources(Instance{Name: "cireilclaw-a", Mounts: []Bind{tc.bind}})
			if tc.wantOK {
				if err != nil {
					t.Fatalf("CheckMountSources: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckMountSources: nil, want an error containing %q", tc.want)
			}
			if ReasonOf(err) != ReasonMountSourceMissing {
				t.Errorf("reason %v, want %v", ReasonOf(err), ReasonMountSourceMissing)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}

	t.Run("every problem is named", func(t *testing.T) {
		err := CheckMountSources(Instance{Name: "cireilclaw-a", Mounts: []Bind{
			{Source: file, Target: "/workspace/a"}, {Source: good, Target: "/workspace/b"}, {Source: loop, Target: "/workspace/c"},
		}})
		if err == nil || !strings.Contains(err.Error(), "/workspace/a") || !strings.Contains(err.Error(), "/workspace/c") || strings.Contains(err.Error(), "/workspace/b") {
			t.Fatalf("CheckMountSources: %v, want the problems of /workspace/a and /workspace/c only", err)
		}
	})
}
