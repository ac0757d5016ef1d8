package runtimetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// MountSourcesRefused ensures, through a driver, instances whose one custom
// mount's source is missing, a regular file and a symbolic-link loop;
// describe builds the instance for a source. Each Ensure must fail with
// MountSourceMissing naming the mount, the path and the problem, before the
// driver lays out anything (the areas stay absent) or asks its
// daemon for anything: the check needs only the host.
func MountSourcesRefused(t T, rt runtimes.Runtime, describe func(src string) runtimes.Instance) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	loop := filepath.Join(dir, "loop")
	if err := os.WriteFile(file, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ src, problem string }{
		{filepath.Join(dir, "missing"), "does not exist"},
		{file, "is not a directory"},
		{loop, "symbolic link loop"},
	} {
		in := describe(tc.src)
		// Whatever the describer prepared, the driver must lay out nothing
		// before it refuses: the areas go first.
		for _, a := range in.Areas {
			if err := os.RemoveAll(a.Source); err != nil {
				t.Fatal(err)
			}
		}
		_, err := rt.Ensure(context.Background(), in)
		if runtimes.ReasonOf(err) != runtimes.ReasonMountSourceMissing {
			t.Fatalf("Ensure with mount source %s: %v (reason %s), want %s", tc.src, err, runtimes.ReasonOf(err), runtimes.ReasonMountSourceMissing)
		}
		for _, want := range []string{in.Mounts[0].Target, tc.src, tc.problem} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("Ensure with mount source %s: %q does not name %q", tc.src, err, want)
			}
		}
		if _, err := os.Lstat(in.Areas[0].Source); !os.IsNotExist(err) {
			t.Fatalf("Ensure with mount source %s laid out %s before refusing (%v)", tc.src, in.Areas[0].Source, err)
		}
	}
}
