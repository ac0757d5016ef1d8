package main

import (
	"context"
	"flag"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

// Every registered backend's flags are on the command line under the
// names they always had, whichever backends --backends enables.
func TestBackendFlagsAreBound(t *testing.T) {
	fs := flag.NewFlagSet("sandbox-controller", flag.ContinueOnError)
	drivers := bindBackendFlags(fs)
	for _, b := range []v1alpha1.Backend{v1alpha1.BackendBwrap, v1alpha1.BackendContainerd, v1alpha1.BackendIncus} {
		if drivers[b] == nil {
			t.Errorf("backend %s has no constructor", b)
		}
	}
	for _, name := range []string{"cgroup-parent", "allow-unlimited-sandboxes", "containerd-address", "containerd-namespace",
		"containerd-fifo-dir", "containerd-mount-namespace", "incus-socket", "bwrap-starter", "bwrap-cgroup-v1-start"} {
		if fs.Lookup(name) == nil {
			t.Errorf("--%s is not bound", name)
		}
	}
	if f := fs.Lookup("bwrap-cgroup-v1-start"); f != nil && f.DefValue != "auto" {
		t.Errorf("--bwrap-cgroup-v1-start defaults to %s, not auto", f.DefValue)
	}
	if f := fs.Lookup("allow-unlimited-sandboxes"); f != nil && f.DefValue != "false" {
		t.Errorf("--allow-unlimited-sandboxes defaults to %s", f.DefValue)
	}
}

func TestUnknownBackendNamesTheAvailable(t *testing.T) {
	fs := flag.NewFlagSet("sandbox-controller", flag.ContinueOnError)
	f := flags{backends: "nope", drivers: bindBackendFlags(fs)}
	_, _, err := enableBackends(context.Background(), f, t.TempDir())
	want := `--backends: unknown backend "nope" (available: bwrap, containerd, incus)`
	if err == nil || err.Error() != want {
		t.Fatalf("enableBackends: %v, want %s", err, want)
	}
}

// A backend the API knows but this build does not link is named as such,
// with the tag that left it out, and the list offered is what is linked.
func TestABackendLeftOutOfTheBuildSaysSo(t *testing.T) {
	fs := flag.NewFlagSet("sandbox-controller", flag.ContinueOnError)
	drivers := bindBackendFlags(fs)
	delete(drivers, v1alpha1.BackendContainerd)
	f := flags{backends: "bwrap,containerd", drivers: drivers}
	_, _, err := enableBackends(context.Background(), f, t.TempDir())
	want := `--backends: backend "containerd" is not in this build: it was built with the tag sandbox_no_containerd (available: bwrap, incus)`
	if err == nil || err.Error() != want {
		t.Fatalf("enableBackends: %v, want %s", err, want)
	}
}

// The tags that leave a driver out leave its client out of the binary
// too (what they are for: a smaller binary and less memory on a node that
// runs one backend). make vet compiles that build.
func TestBuildTagsLeaveTheDriversOut(t *testing.T) {
	deps := func(tags string) map[string]bool {
		t.Helper()
		out, err := exec.Command("go", "list", "-tags", tags, "-deps", ".").Output()
		if err != nil {
			t.Fatalf("go list -tags %q: %v", tags, err)
		}
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	const ctrd, incus = "github.com/containerd/containerd/v2/client", "github.com/cireilclaw/sandbox-controller/runtimes/incus"
	all := deps("")
	if !all[ctrd] || !all[incus] {
		t.Fatalf("the default build links neither %s nor %s: the test would prove nothing", ctrd, incus)
	}
	slim := deps("sandbox_no_containerd,sandbox_no_incus")
	for p := range slim {
		if strings.HasPrefix(p, "github.com/containerd/containerd/") || p == incus ||
			p == "github.com/cireilclaw/sandbox-controller/runtimes/containerd" {
			t.Errorf("the build without containerd and incus links %s", p)
		}
	}
	if !slim["github.com/cireilclaw/sandbox-controller/runtimes/bwrap"] {
		t.Errorf("the build without containerd and incus lost bwrap's driver")
	}
}

// At start the controller says how bwrap commands start inside their
// cgroups on cgroup v1, as told by --bwrap-cgroup-v1-start.
func TestTheCgroupV1StartIsLogged(t *testing.T) {
	fs := flag.NewFlagSet("sandbox-controller", flag.ContinueOnError)
	f := flags{backends: "bwrap", drivers: bindBackendFlags(fs)}
	if err := fs.Parse([]string{"--bwrap-cgroup-v1-start=move"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rts, closeAll, err := enableBackends(context.Background(), f, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	// Before the directory goes: the driver's trees are mounts.
	t.Cleanup(func() {
		if err := bwrap.DetachTrees(filepath.Join(dir, "bwrap")); err != nil {
			t.Error(err)
		}
	})
	var lines []string
	logCgroupStarts(funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{}), rts)
	how, _ := rts[v1alpha1.BackendBwrap].(*bwrap.Runtime).CgroupV1Start()
	t.Logf("%q: %q", how, lines)
	switch {
	case how == "" && len(lines) != 0:
		t.Errorf("with nothing to choose (cgroup v2, or no cgroups), the controller said: %q", lines)
	case how != "" && (len(lines) != 1 || !strings.Contains(lines[0], `"start"="move"`)):
		t.Errorf("told to move commands in, the controller said: %q", lines)
	}
}
