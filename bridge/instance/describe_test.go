package instance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// The encodings below are what runtimes.Describe gave, with the API's types
// in the Instance, before the drivers got types of their own. The
// ConfigHash is the hash of this encoding (runtimes' ConfigHash version 1
// writes it out field by field), and the containerd and incus drivers
// record it on their instances: while it holds, no running instance
// restarts for a change of the Instance's shape. $ROOT is the areas root.
var encodings = []struct {
	name string
	spec *v1alpha1.SandboxSpec
	want string
}{
	{"bwrap", &v1alpha1.SandboxSpec{Agent: "a", Binaries: []v1alpha1.BinaryName{"sh", "cat"}, Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"TOKEN"}},
		Devices: v1alpha1.Devices{USB: true},
		Mounts: []v1alpha1.Mount{{Source: "/srv/ro", Target: "ro"}, {Source: "/srv/rw", Target: "rw", Mode: v1alpha1.MountReadWrite},
			{Source: "/srv/ovl", Target: "ovl", Mode: v1alpha1.MountOverlay, SizeLimit: ptr.To(resource.MustParse("100Ki"))}}},
		`{"name":"cireilclaw-a","agent":"a","owner":"","agentDir":"$ROOT/a","areas":[{"source":"$ROOT/a/workspace","target":"/workspace","readOnly":false},{"source":"$ROOT/a/memories","target":"/memories","readOnly":false},{"source":"$ROOT/a/blocks","target":"/blocks","readOnly":true},{"source":"$ROOT/a/skills","target":"/skills","readOnly":false},{"source":"$ROOT/a/tasks","target":"/tasks","readOnly":false}],"mounts":[{"source":"/srv/rw/repo/.git","target":"/srv/rw/repo/.git","readOnly":false,"gitDir":true},{"source":"$ROOT/a/.overlay/ovl/merged","target":"/workspace/ovl","readOnly":false,"overlay":{"lower":"/srv/ovl","upper":"$ROOT/a/.overlay/ovl/disk/upper","work":"$ROOT/a/.overlay/ovl/disk/work","merged":"$ROOT/a/.overlay/ovl/merged","sizeLimit":102400,"owner":70000,"disk":"$ROOT/a/.overlay/ovl/disk"}},{"source":"/srv/ro","target":"/workspace/ro","readOnly":true},{"source":"/srv/rw","target":"/workspace/rw","readOnly":false}],"binaries":["cat","sh"],"devices":{"usb":true},"passthrough":["TOKEN"],"identity":{"uid":70000,"gid":70000},"stopOnExit":false,"resources":{"pids":2048}}`},
	{"containerd", &v1alpha1.SandboxSpec{Agent: "b", Backend: v1alpha1.BackendContainerd, Binaries: []v1alpha1.BinaryName{"sh"}, Devices: v1alpha1.Devices{All: true},
		Containerd: &v1alpha1.ContainerdSpec{Image: "localhost/x:1", MemoryLimit: ptr.To(resource.MustParse("0.5Gi")), PidsLimit: ptr.To[int64](64), RootfsSizeLimit: ptr.To(resource.MustParse("1G"))}},
		`{"name":"cireilclaw-b","agent":"b","owner":"","agentDir":"$ROOT/b","areas":[{"source":"$ROOT/b/workspace","target":"/workspace","readOnly":false},{"source":"$ROOT/b/memories","target":"/memories","readOnly":false},{"source":"$ROOT/b/blocks","target":"/blocks","readOnly":true},{"source":"$ROOT/b/skills","target":"/skills","readOnly":false},{"source":"$ROOT/b/tasks","target":"/tasks","readOnly":false}],"mounts":null,"binaries":["sh"],"devices":{"all":true},"passthrough":null,"image":"localhost/x:1","containerd":{"image":"localhost/x:1","memoryLimit":"512Mi","pidsLimit":64,"rootfsSizeLimit":"1G"},"identity":{"uid":70000,"gid":70000},"stopOnExit":false,"resources":{"memoryBytes":536870912,"pids":64}}`},
	{"containerd-bare", &v1alpha1.SandboxSpec{Agent: "c", Backend: v1alpha1.BackendContainerd, Containerd: &v1alpha1.ContainerdSpec{Image: "localhost/x:1"}},
		`{"name":"cireilclaw-c","agent":"c","owner":"","agentDir":"$ROOT/c","areas":[{"source":"$ROOT/c/workspace","target":"/workspace","readOnly":false},{"source":"$ROOT/c/memories","target":"/memories","readOnly":false},{"source":"$ROOT/c/blocks","target":"/blocks","readOnly":true},{"source":"$ROOT/c/skills","target":"/skills","readOnly":false},{"source":"$ROOT/c/tasks","target":"/tasks","readOnly":false}],"mounts":null,"binaries":null,"devices":{},"passthrough":null,"image":"localhost/x:1","containerd":{"image":"localhost/x:1"},"identity":{"uid":70000,"gid":70000},"stopOnExit":false,"resources":{"pids":2048}}`},
	{"incus", &v1alpha1.SandboxSpec{Agent: "d", Backend: v1alpha1.BackendIncus, Binaries: []v1alpha1.BinaryName{"sh"},
		Incus: &v1alpha1.IncusSpec{Image: "images:debian/12", Profiles: []string{"default", "x"}, Project: "p", ShutdownOnExit: ptr.To(false), RootSizeLimit: ptr.To(resource.MustParse("10Gi"))}},
		`{"name":"cireilclaw-d","agent":"d","owner":"","agentDir":"$ROOT/d","areas":[{"source":"$ROOT/d/workspace","target":"/workspace","readOnly":false},{"source":"$ROOT/d/memories","target":"/memories","readOnly":false},{"source":"$ROOT/d/blocks","target":"/blocks","readOnly":true},{"source":"$ROOT/d/skills","target":"/skills","readOnly":false},{"source":"$ROOT/d/tasks","target":"/tasks","readOnly":false}],"mounts":null,"binaries":["sh"],"devices":{},"passthrough":null,"image":"images:debian/12","incus":{"image":"images:debian/12","profiles":["default","x"],"project":"p","shutdownOnExit":false,"rootSizeLimit":"10Gi"},"identity":{"uid":70000,"gid":70000},"stopOnExit":false,"resources":{"pids":2048}}`},
	{"incus-bare", &v1alpha1.SandboxSpec{Agent: "e", Backend: v1alpha1.BackendIncus, Incus: &v1alpha1.IncusSpec{Image: "images:debian/12", ShutdownOnExit: ptr.To(true)}},
		`{"name":"cireilclaw-e","agent":"e","owner":"","agentDir":"$ROOT/e","areas":[{"source":"$ROOT/e/workspace","target":"/workspace","readOnly":false},{"source":"$ROOT/e/memories","target":"/memories","readOnly":false},{"source":"$ROOT/e/blocks","target":"/blocks","readOnly":true},{"source":"$ROOT/e/skills","target":"/skills","readOnly":false},{"source":"$ROOT/e/tasks","target":"/tasks","readOnly":false}],"mounts":null,"binaries":null,"devices":{},"passthrough":null,"image":"images:debian/12","incus":{"image":"images:debian/12","shutdownOnExit":true},"identity":{"uid":70000,"gid":70000},"stopOnExit":true,"resources":{"pids":2048}}`},
	{"incus-nil", &v1alpha1.SandboxSpec{Agent: "f", Backend: v1alpha1.BackendIncus, Incus: &v1alpha1.IncusSpec{Image: "images:debian/12"}},
		`{"name":"cireilclaw-f","agent":"f","owner":"","agentDir":"$ROOT/f","areas":[{"source":"$ROOT/f/workspace","target":"/workspace","readOnly":false},{"source":"$ROOT/f/memories","target":"/memories","readOnly":false},{"source":"$ROOT/f/blocks","target":"/blocks","readOnly":true},{"source":"$ROOT/f/skills","target":"/skills","readOnly":false},{"source":"$ROOT/f/tasks","target":"/tasks","readOnly":false}],"mounts":null,"binaries":null,"devices":{},"passthrough":null,"image":"images:debian/12","incus":{"image":"images:debian/12"},"identity":{"uid":70000,"gid":70000},"stopOnExit":true,"resources":{"pids":2048}}`},
}

func TestEncodingIsTheOneOfTheAPITypes(t *testing.T) {
	for _, tc := range encodings {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			ids, err := areas.NewIdentities(root, areas.IDRange{First: 70000, Count: 1})
			if err != nil {
				t.Fatal(err)
			}
			sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: tc.name}, Spec: *tc.spec}
			if err := Prepare(tc.spec, Host{AreasRoot: root, Identities: ids}); err != nil {
				t.Fatal(err)
			}
			in, err := FromSandbox(sb, nil, Host{AreasRoot: root, Identities: ids})
			if err != nil {
				t.Fatal(err)
			}
			in = WithGitDirs(in, []string{"/srv/rw/repo/.git"})
			// The ConfigHash is still the hash of the recorded encoding
			// (runtimes' ConfigHash version 1 input), whatever shape the
			// Instance has now.
			recorded := strings.ReplaceAll(tc.want, "$ROOT", root)
			sum := sha256.Sum256([]byte(recorded))
			if want := hex.EncodeToString(sum[:8]); in.ConfigHash != want || in.Hash() != want {
				t.Errorf("ConfigHash %s (hash %s) is not the hash of the recorded encoding (%s): every such instance would restart", in.ConfigHash, in.Hash(), want)
			}
			// A description a driver recorded in that encoding decodes to
			// the same configuration.
			var back runtimes.Instance
			if err := json.Unmarshal([]byte(recorded), &back); err != nil {
				t.Fatalf("a recorded description does not decode: %v", err)
			}
			if back.Hash() != in.ConfigHash {
				t.Errorf("a recorded description hashes to %s, not %s", back.Hash(), in.ConfigHash)
			}
			// And one recorded now decodes to it too.
			now, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			back = runtimes.Instance{}
			if err := json.Unmarshal(now, &back); err != nil || back.Hash() != in.ConfigHash {
				t.Errorf("a description recorded now hashes to %s (%v), not %s", back.Hash(), err, in.ConfigHash)
			}
		})
	}
}

func TestLimitsReachTheDriversInBytes(t *testing.T) {
	spec := &v1alpha1.SandboxSpec{Agent: "b", Backend: v1alpha1.BackendContainerd,
		Containerd: &v1alpha1.ContainerdSpec{Image: "x", MemoryLimit: ptr.To(resource.MustParse("0.5Gi")), PidsLimit: ptr.To[int64](64)}}
	in, err := Standalone(spec, Host{AreasRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(in)
	var back runtimes.Instance
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*runtimes.ContainerdConfig{in.Containerd, back.Containerd} {
		if c.MemoryLimit.BytesOf() != 512<<20 || c.PidsLimit != 64 || c.RootfsSizeLimit.BytesOf() != 0 {
			t.Errorf("containerd config %+v (memory %+v), want 512Mi in bytes, 64 pids, no rootfs limit", c, c.MemoryLimit)
		}
	}
	if in.Owner != StandaloneOwner("b") {
		t.Errorf("owner %q", in.Owner)
	}
}

func TestGitDirsAreBoundOnlyInsideReadWriteMounts(t *testing.T) {
	spec := &v1alpha1.SandboxSpec{Agent: "a", Mounts: []v1alpha1.Mount{
		{Source: "/srv/ro", Target: "ro"}, {Source: "/srv/rw", Target: "rw", Mode: v1alpha1.MountReadWrite}}}
	in, err := Standalone(spec, Host{AreasRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	before := in.ConfigHash
	got := WithGitDirs(in, []string{"/srv/rw/repo/.git", "/srv/rw/repo/.git/", "/srv/ro/repo/.git", "/etc", "/srv/rw"})
	if dirs := GitDirs(got); len(dirs) != 1 || dirs[0] != "/srv/rw/repo/.git" {
		t.Errorf("bound %v, want only /srv/rw/repo/.git", dirs)
	}
	if got.ConfigHash == before || got.ConfigHash != got.Hash() {
		t.Errorf("ConfigHash %s: not recomputed for the binds (before %s)", got.ConfigHash, before)
	}
	if len(GitDirs(in)) != 0 {
		t.Error("WithGitDirs changed the instance it was given")
	}
}
