package sandboxtoml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
)

// The seed's own samples, word for word.
const (
	seedSample = `backend = "bwrap"
mounts = []
[bwrap]
binaries = ["git", "python3"]
`
	seedMounts = `[[mounts]]
source = "/home/user/projects/my-app"
target = "project"
mode = "rw"
`
	seedDevices = `[devices]
usb = true
all = true
`
	seedIncus = `backend = "incus"
[incus]
image = "images:fedora/42"
profiles = []
# project = "cireilclaw"
# shutdownOnExit = false
`
)

func TestSeedSamplesLoad(t *testing.T) {
	no := false
	cases := []struct {
		name string
		toml string
		want v1alpha1.SandboxSpec
	}{
		{"seed/sample", seedSample, v1alpha1.SandboxSpec{Agent: "ada", Backend: "bwrap", Binaries: []v1alpha1.BinaryName{"git", "python3"}}},
		{"seed/mounts", seedMounts, v1alpha1.SandboxSpec{Agent: "ada", Backend: "bwrap", Mounts: []v1alpha1.Mount{{Source: "/home/user/projects/my-app", Target: "project", Mode: "rw"}}}},
		{"seed/devices", seedDevices, v1alpha1.SandboxSpec{Agent: "ada", Backend: "bwrap", Devices: v1alpha1.Devices{USB: true, All: true}}},
		{"seed/incus", seedIncus, v1alpha1.SandboxSpec{Agent: "ada", Backend: "incus", Incus: &v1alpha1.IncusSpec{Image: "images:fedora/42", Profiles: []string{}}}},
		{"incus project and shutdownOnExit", "backend = \"incus\"\n[incus]\nimage = \"x\"\nproject = \"cireilclaw\"\nshutdownOnExit = false\n",
			v1alpha1.SandboxSpec{Agent: "ada", Backend: "incus", Incus: &v1alpha1.IncusSpec{Image: "x", Project: "cireilclaw", ShutdownOnExit: &no}}},
		{"mode defaults to ro", "[[mounts]]\nsource = \"~/src\"\ntarget = \"src\"\n",
			v1alpha1.SandboxSpec{Agent: "ada", Backend: "bwrap", Mounts: []v1alpha1.Mount{{Source: "~/src", Target: "src", Mode: "ro"}}}},
		{"env passthrough", "[env]\npassthrough = [\"SSH_AUTH_SOCK\"]\n",
			v1alpha1.SandboxSpec{Agent: "ada", Backend: "bwrap", Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"SSH_AUTH_SOCK"}}}},
		{"containerd", "backend = \"containerd\"\n[containerd]\nimage = \"busybox:latest\"\n",
			v1alpha1.SandboxSpec{Agent: "ada", Backend: "containerd", Containerd: &v1alpha1.ContainerdSpec{Image: "busybox:latest"}}},
		{"empty file is the default", "", *Default("ada")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse("sandbox.toml", []byte(c.toml), "ada")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(*got, c.want) {
				t.Fatalf("Parse =\n  %+v\nwant\n  %+v", *got, c.want)
			}
		})
	}
}

func TestRepositorySampleLoads(t *testing.T) {
	spec, err := Load(filepath.Join("..", "..", "config", "sandbox.toml"), "ada")
	if err != nil {
		t.Fatalf("config/sandbox.toml: %v", err)
	}
	if !slices.Equal(spec.Binaries, []v1alpha1.BinaryName{"git", "python3"}) || spec.BackendOrDefault() != v1alpha1.BackendBwrap {
		t.Fatalf("config/sandbox.toml is not the seed's sample: %+v", spec)
	}
}

func TestMissingFileIsTheDefault(t *testing.T) {
	spec, err := Load(filepath.Join(t.TempDir(), "sandbox.toml"), "ada")
	if err != nil {
		t.Fatal(err)
	}
	if spec.BackendOrDefault() != v1alpha1.BackendBwrap || len(spec.Mounts) != 0 || len(spec.Binaries) != 0 {
		t.Fatalf("missing file gave %+v, want the default backend with no mounts", spec)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "sandbox.toml"), "Not A Label"); err == nil || !strings.Contains(err.Error(), v1alpha1.MsgAgentLabel) {
		t.Fatalf("missing file with a bad agent: %v", err)
	}
}

func TestUnknownKeysAndSyntaxErrorsHaveLineAndColumn(t *testing.T) {
	cases := []struct {
		name, toml, want string
	}{
		{"unknown top-level key", "backend = \"bwrap\"\nbackends = 1\n", `sandbox.toml:2:1: backends: unknown key "backends"`},
		{"unknown key in a table", "[bwrap]\n  binaries = []\n  binarys = [\"git\"]\n", `sandbox.toml:3:3: bwrap.binarys: unknown key "bwrap.binarys"`},
		{"unknown table once, not per key", "[firewall]\nallow = true\ndeny = false\n", `sandbox.toml:1:1: firewall: unknown key "firewall"`},
		{"case matters", "Backend = \"bwrap\"\n", `sandbox.toml:1:1: Backend: unknown key "Backend" (keys are case-sensitive: did you mean "backend"?)`},
		{"unknown key in a mount", "[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\nreadonly = true\n", `sandbox.toml:4:1: mounts.readonly: unknown key "mounts.readonly"`},
		{"unknown key in an inline mount", "mounts = [{source = \"/a\", target = \"a\", mdoe = \"rw\"}]\n", `sandbox.toml:1:41: mounts.mdoe: unknown key "mounts.mdoe"`},
		{"unknown dotted key", "devices.serial = true\n", `sandbox.toml:1:1: devices.serial: unknown key "devices.serial"`},
		{"syntax error", "backend = \"bwrap\"\n[bwrap\n", `sandbox.toml:2:7: expected '.' or ']' to end table name`},
		{"unterminated array", "[bwrap]\nbinaries = [\"git\",\n", `sandbox.toml:2:19: bwrap.binaries: unexpected EOF`},
		{"wrong type", "[devices]\nusb = \"yes\"\n", `sandbox.toml:2: devices.usb: incompatible types`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("sandbox.toml", []byte(c.toml), "ada")
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("Parse(%q) error\n  %v\nwant it to start with\n  %s", c.toml, err, c.want)
			}
			var te *Error
			if !errors.As(err, &te) || te.Line == 0 {
				t.Fatalf("error %v carries no line", err)
			}
		})
	}
}

// TestRulesAreTheAPIsRules runs each bad input through the TOML loader and,
// as the equivalent spec, through the API's validation, and wants the same
// message constant from both: one table of rules, two entry points.
func TestRulesAreTheAPIsRules(t *testing.T) {
	cases := []struct {
		name string
		toml string
		spec func(*v1alpha1.SandboxSpec)
		msg  string
		// at is where the loader must point, "line:column".
		at string
	}{
		{"relative mount source", "[[mounts]]\nsource = \"projects/x\"\ntarget = \"x\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "projects/x", Target: "x", Mode: "ro"}}
			},
			v1alpha1.MsgMountSource, "2:1"},
		{"absolute mount target", "[[mounts]]\nsource = \"/a\"\ntarget = \"/workspace/x\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "/workspace/x", Mode: "ro"}}
			},
			v1alpha1.MsgMountTargetAbs, "3:1"},
		{"dot-dot mount target", "[[mounts]]\nsource = \"/a\"\n  target = \"../etc\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "../etc", Mode: "ro"}}
			},
			v1alpha1.MsgMountTargetDots, "3:3"},
		{"empty segment in a mount target", "[[mounts]]\nsource = \"/a\"\ntarget = \"a//b\"\n",
			func(s *v1alpha1.SandboxSpec) { s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "a//b", Mode: "ro"}} },
			v1alpha1.MsgMountTargetEmpty, "3:1"},
		{"bad mount mode", "[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\nmode = \"wr\"\n",
			func(s *v1alpha1.SandboxSpec) { s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "a", Mode: "wr"}} },
			v1alpha1.MsgMountMode, "4:1"},
		{"nested mount targets", "[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\n[[mounts]]\nsource = \"/b\"\ntarget = \"a/b\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "a", Mode: "ro"}, {Source: "/b", Target: "a/b", Mode: "ro"}}
			},
			v1alpha1.MsgMountOverlap, "4:1"},
		{"equal mount targets", "mounts = [{source = \"/a\", target = \"a\"}, {source = \"/b\", target = \"a\"}]\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "a", Mode: "ro"}, {Source: "/b", Target: "a", Mode: "ro"}}
			},
			v1alpha1.MsgMountOverlap, "1:1"},
		{"egress host with a scheme", "[network]\negress = \"Allowlist\"\n[[network.allow]]\nhost = \"https://github.com\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Network = &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist, Allow: []v1alpha1.EgressRule{{Host: "https://github.com"}}}
			},
			v1alpha1.MsgEgressHost, "4:1"},
		{"egress allow entries without Allowlist", "[network]\n[[network.allow]]\nhost = \"github.com\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Network = &v1alpha1.Network{Egress: v1alpha1.EgressNone, Allow: []v1alpha1.EgressRule{{Host: "github.com"}}}
			},
			v1alpha1.MsgEgressAllowOnly, ""},
		{"binary with a space", "[bwrap]\nbinaries = [\"git status\"]\n",
			func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"git status"} },
			v1alpha1.MsgBinarySpace, "2:1"},
		{"binary with a metacharacter", "[bwrap]\nbinaries = [\"git\", \"sh;rm\"]\n",
			func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"git", "sh;rm"} },
			v1alpha1.MsgBinaryMeta, "2:1"},
		{"binary as a path", "[bwrap]\nbinaries = [\"/usr/bin/git\"]\n",
			func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"/usr/bin/git"} },
			v1alpha1.MsgBinarySlash, "2:1"},
		{"bad passthrough name", "[env]\npassthrough = [\"MY-VAR\"]\n",
			func(s *v1alpha1.SandboxSpec) { s.Env.Passthrough = []v1alpha1.EnvVarName{"MY-VAR"} },
			v1alpha1.MsgEnvName, "2:1"},
		{"incus without its table", "backend = \"incus\"\n",
			func(s *v1alpha1.SandboxSpec) { s.Backend = v1alpha1.BackendIncus },
			v1alpha1.MsgIncusRequired, ""},
		{"incus without an image", "backend = \"incus\"\n[incus]\nprofiles = []\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Backend = v1alpha1.BackendIncus
				s.Incus = &v1alpha1.IncusSpec{Profiles: []string{}}
			},
			v1alpha1.MsgIncusRequired, "2:1"},
		{"sizeLimit on a mount that is not an overlay", "[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\nmode = \"rw\"\nsizeLimit = \"1Gi\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "a", Mode: "rw", SizeLimit: ptr.To(resource.MustParse("1Gi"))}}
			},
			v1alpha1.MsgMountSizeLimit, "5:1"},
		{"containerd without its table", "backend = \"containerd\"\n",
			func(s *v1alpha1.SandboxSpec) { s.Backend = v1alpha1.BackendContainerd },
			v1alpha1.MsgContainerdRequired, ""},
		{"~/ mount source climbing out of the home directory", "[[mounts]]\nsource = \"~/../../etc\"\ntarget = \"etc\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "~/../../etc", Target: "etc", Mode: "ro"}}
			},
			v1alpha1.MsgMountSourceDots, "2:1"},
		{"mount target with a right-to-left override", "[[mounts]]\nsource = \"/a\"\ntarget = \"a\\u202Eb\"\n",
			func(s *v1alpha1.SandboxSpec) {
				s.Mounts = []v1alpha1.Mount{{Source: "/a", Target: "a\u202Eb", Mode: "ro"}}
			},
			v1alpha1.MsgMountTargetChars, "3:1"},
		{"binary starting with '-'", "[bwrap]\nbinaries = [\"-rf\"]\n",
			func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"-rf"} },
			v1alpha1.MsgBinaryPortable, "2:1"},
		{"binary with a zero-width space", "[bwrap]\nbinaries = [\"gi\\u200Bt\"]\n",
			func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{"gi\u200Bt"} },
			v1alpha1.MsgBinaryPortable, "2:1"},
	}
	for _, c := range cases {
		t.Run("rule/"+c.name, func(t *testing.T) {
			spec := Default("ada")
			c.spec(spec)
			var apiMsgs []string
			for _, fe := range backend.ValidateSpec(spec) {
				apiMsgs = append(apiMsgs, fe.Detail)
			}
			if !slices.Contains(apiMsgs, c.msg) {
				t.Fatalf("the API's validation of the equivalent spec says %q, want %q", apiMsgs, c.msg)
			}
			_, err := Parse("sandbox.toml", []byte(c.toml), "ada")
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("the loader says %v, want %q", err, c.msg)
			}
			var tomlMsgs []string
			var first *Error
			for _, e := range unjoin(err) {
				var te *Error
				if !errors.As(e, &te) {
					t.Fatalf("loader error %v is not an *Error", e)
				}
				tomlMsgs = append(tomlMsgs, te.Message)
				if first == nil && strings.HasSuffix(te.Message, c.msg) {
					first = te
				}
			}
			if len(tomlMsgs) != len(apiMsgs) {
				t.Fatalf("the loader reports %q, the API %q: the two must agree", tomlMsgs, apiMsgs)
			}
			if c.at != "" {
				if got := fmt.Sprintf("%d:%d", first.Line, first.Column); got != c.at {
					t.Fatalf("the loader points at %s (%v), want %s", got, first, c.at)
				}
			}
		})
	}
}

func TestOverlaySizeLimit(t *testing.T) {
	spec, err := Parse("sandbox.toml", []byte("[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\nmode = \"overlay\"\nsizeLimit = \"512Mi\"\n"), "ada")
	if err != nil {
		t.Fatal(err)
	}
	if m := spec.Mounts[0]; m.Mode != v1alpha1.MountOverlay || m.SizeLimit == nil || m.SizeLimit.Value() != 512<<20 {
		t.Fatalf("mount = %+v", m)
	}
	_, err = Parse("sandbox.toml", []byte("[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\nmode = \"overlay\"\n  sizeLimit = \"lots\"\n"), "ada")
	var te *Error
	if !errors.As(err, &te) || te.Key != "mounts[0].sizeLimit" || te.Line != 5 || te.Column != 3 || !strings.Contains(te.Message, "512Mi") {
		t.Fatalf("a size that is not a quantity: %v (%+v)", err, te)
	}
	_, err = Parse("sandbox.toml", []byte("[[mounts]]\nsource = \"/a\"\ntarget = \"a\"\nmode = \"overlay\"\nsizeLimit = \"0Gi\"\n"), "ada")
	if !errors.As(err, &te) || te.Key != "mounts[0].sizeLimit" || te.Line != 5 || !strings.Contains(te.Message, v1alpha1.MsgMountSizePositive) {
		t.Fatalf("a zero size: %v (%+v)", err, te)
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestNetworkTable(t *testing.T) {
	spec, err := Parse("sandbox.toml", []byte("[network]\negress = \"Allowlist\"\n[[network.allow]]\nhost = \"github.com\"\nports = [443, 22]\n[[network.allow]]\nhost = \"*.pythonhosted.org\"\n"), "ada")
	if err != nil {
		t.Fatal(err)
	}
	want := &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist, Allow: []v1alpha1.EgressRule{{Host: "github.com", Ports: []int32{443, 22}}, {Host: "*.pythonhosted.org"}}}
	if !reflect.DeepEqual(spec.Network, want) {
		t.Fatalf("network = %+v, want %+v", spec.Network, want)
	}
	out, err := Manifest(spec, "", "agents")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "egress: Allowlist") || !strings.Contains(string(out), "host: '*.pythonhosted.org'") {
		t.Fatalf("the manifest lacks the network:\n%s", out)
	}
	_, err = Parse("sandbox.toml", []byte("[network]\negress = \"Allowlist\"\n[[network.allow]]\nhost = \"github.com\"\nports = [0]\n"), "ada")
	var te *Error
	if !errors.As(err, &te) || te.Key != "network.allow[0].ports[0]" || !strings.Contains(te.Message, v1alpha1.MsgEgressPort) {
		t.Fatalf("port 0: %v (%+v)", err, te)
	}
}

func TestManifest(t *testing.T) {
	spec, err := Parse("sandbox.toml", []byte(strings.Replace(seedSample, "mounts = []\n", "", 1)+"\n"+seedMounts+"\n"+seedDevices), "ada")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Manifest(spec, "", "agents")
	if err != nil {
		t.Fatal(err)
	}
	var back v1alpha1.Sandbox
	if err := yaml.UnmarshalStrict(out, &back); err != nil {
		t.Fatalf("the manifest does not read back as a Sandbox: %v\n%s", err, out)
	}
	if back.APIVersion != "sandbox.cireilclaw.dev/v1alpha1" || back.Kind != "Sandbox" || back.Name != "ada" || back.Namespace != "agents" {
		t.Fatalf("manifest header: %s %s %s/%s", back.APIVersion, back.Kind, back.Namespace, back.Name)
	}
	if !reflect.DeepEqual(back.Spec, *spec) {
		t.Fatalf("manifest spec\n  %+v\nwant\n  %+v", back.Spec, *spec)
	}
	if strings.Contains(string(out), "status") {
		t.Fatalf("manifest carries a status:\n%s", out)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
