package bwrap

import (
	"os"
	"slices"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/startns"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Every option the driver gives bubblewrap is known to
// startns.ForBubblewrap, so a
// command starts with the host's mounts its bubblewrap needs, not all of
// them: with the host's system, with an image, with USB devices, a
// network, custom and git directory binds, and an environment whose
// values look like options.
func TestForBubblewrapKnowsEveryOptionTheDriverGives(t *testing.T) {
	r := &Runtime{host: Host{}.withDefaults()}
	base := runtimes.Instance{Name: "cireilclaw-ann", Binaries: []string{"true", "git"}}
	usb := base
	usb.Devices.USB = true
	usb.Network = &runtimes.Network{Namespace: "/run/ns/ann"}
	all := base
	all.Devices.All = true
	c := Command{
		Path:    "/opt/tools/bin/tool",
		Args:    []string{"--ro-bind", "/etc", "x"},
		Env:     []string{"A=--ro-bind", "B=/etc/shadow", "C=--"},
		Binds:   []string{"/nix/store/abc-tool"},
		Areas:   []runtimes.Bind{{Source: "/run/trees/ann/workspace", Target: "/workspace"}, {Source: "/run/trees/ann/memories", Target: "/memories", ReadOnly: true}},
		GitDirs: []string{"/workspace/.git"},
	}
	image := c
	image.Image = &imageView{
		system:      []imageEntry{{dest: "/usr", file: 0}, {dest: "/bin", file: -1, target: "usr/bin"}},
		commandDirs: []string{"/usr/bin"},
		commands:    []imageEntry{{dest: "/usr/bin/true", file: 1}},
		etc:         []imageEntry{{dest: "/etc/passwd", file: 2}},
		files:       make([]*os.File, 3),
	}
	// The descriptors the command inherits: the image's three, then the
	// git directory's.
	var files []*os.File
	for _, p := range []string{"/usr", "/usr/bin", "/etc", "/var/tmp"} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	for name, args := range map[string][]string{
		"host system":        r.Args(base, c),
		"an image":           r.Args(base, image),
		"usb and a network":  r.Args(usb, c),
		"every device":       r.Args(all, c),
		"areas from sources": r.Args(base, Command{Path: "/usr/bin/true"}),
	} {
		h := startns.ForBubblewrap(args, files, "/usr/bin/bwrap", "/opt/holder")
		if h == nil {
			t.Errorf("%s: ForBubblewrap does not know an option of %q", name, args)
			continue
		}
		if !slices.Equal(h.Paths, []string{"/usr/bin/bwrap", "/opt/holder"}) {
			t.Errorf("%s: paths %q", name, h.Paths)
		}
		for _, b := range h.Binds {
			if b == "x" || b == "--ro-bind" || b == "/etc/shadow" || b == "--" {
				t.Errorf("%s: an operand that is not a source taken as one: %q", name, b)
			}
		}
		if name == "an image" {
			// Each descriptor bound as the path it names, as bubblewrap
			// binds it.
			for _, want := range []string{"/usr", "/usr/bin", "/etc", "/var/tmp"} {
				if !slices.Contains(h.Binds, want) {
					t.Errorf("%s: %s is not among the sources %q", name, want, h.Binds)
				}
			}
		}
		if name == "host system" {
			for _, want := range []string{"/nix/store/abc-tool", "/opt/tools/bin/tool", "/run/trees/ann/workspace", "/run/trees/ann/memories", "/usr"} {
				if !slices.Contains(h.Binds, want) {
					t.Errorf("%s: %s is not among the sources %q", name, want, h.Binds)
				}
			}
		}
	}
}
