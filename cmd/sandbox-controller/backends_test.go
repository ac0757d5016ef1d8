package main

import (
	"context"
	"flag"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
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
		"containerd-fifo-dir", "containerd-mount-namespace", "incus-socket"} {
		if fs.Lookup(name) == nil {
			t.Errorf("--%s is not bound", name)
		}
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
