package containerd

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/mounttree"
)

func describe(t *testing.T, mutate func(*v1alpha1.SandboxSpec)) runtimes.Instance {
	t.Helper()
	spec := &v1alpha1.SandboxSpec{
		Agent:      "alice",
		Backend:    v1alpha1.BackendContainerd,
		Binaries:   []v1alpha1.BinaryName{"sh"},
		Containerd: &v1alpha1.ContainerdSpec{Image: "localhost/busybox:test"},
		Mounts:     []v1alpha1.Mount{{Source: "/srv/project", Target: "project", Mode: v1alpha1.MountReadWrite}},
	}
	if mutate != nil {
		mutate(spec)
	}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: "/areas"})
	if err != nil {
		t.Fatalf("describing the instance: %v", err)
	}
	return in
}

func TestDiff(t *testing.T) {
	base := describe(t, nil)
	tests := []struct {
		name        string
		mutate      func(*v1alpha1.SandboxSpec)
		restart     []string
		image, lims bool
	}{
		{name: "unchanged"},
		{name: "allowlist applies live", mutate: func(s *v1alpha1.SandboxSpec) { s.Binaries = append(s.Binaries, "git") }},
		{name: "passthrough applies live", mutate: func(s *v1alpha1.SandboxSpec) { s.Env.Passthrough = []v1alpha1.EnvVarName{"TOKEN"} }},
		{name: "rootfs size limit applies live", mutate: func(s *v1alpha1.SandboxSpec) { s.Containerd.RootfsSizeLimit = ptr.To(resource.MustParse("1Gi")) }},
		{name: "memory limit applies live", mutate: func(s *v1alpha1.SandboxSpec) { s.Containerd.MemoryLimit = ptr.To(resource.MustParse("256Mi")) }, lims: true},
		{name: "pids limit applies live", mutate: func(s *v1alpha1.SandboxSpec) { s.Containerd.PidsLimit = ptr.To[int64](64) }, lims: true},
		{name: "image needs a restart and a new root", mutate: func(s *v1alpha1.SandboxSpec) { s.Containerd.Image = "localhost/debian:git" },
			restart: []string{`image "localhost/busybox:test" → "localhost/debian:git"`}, image: true},
		{name: "a new mount needs a restart", mutate: func(s *v1alpha1.SandboxSpec) {
			s.Mounts = append(s.Mounts, v1alpha1.Mount{Source: "/srv/docs", Target: "docs", Mode: v1alpha1.MountReadOnly})
		}, restart: []string{"mounts"}},
		{name: "a mount's mode needs a restart", mutate: func(s *v1alpha1.SandboxSpec) { s.Mounts[0].Mode = v1alpha1.MountReadOnly }, restart: []string{"mounts"}},
		{name: "devices need a restart", mutate: func(s *v1alpha1.SandboxSpec) { s.Devices.USB = true }, restart: []string{"devices"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Diff(base, describe(t, tt.mutate))
			if !slices.Equal(c.Restart, tt.restart) || c.Image != tt.image || c.Limits != tt.lims {
				t.Errorf("Diff = %+v, want restart %q image %v limits %v", c, tt.restart, tt.image, tt.lims)
			}
			if c.NeedsRestart() != (len(tt.restart) > 0) {
				t.Errorf("NeedsRestart = %v with %q", c.NeedsRestart(), c.Restart)
			}
		})
	}
}

func TestDiffAppliesGitDirBindsLive(t *testing.T) {
	base := describe(t, nil)
	one, two := runtimes.Bind{Source: "/srv/a/.git", Target: "/srv/a/.git"}, runtimes.Bind{Source: "/srv/b/.git", Target: "/srv/b/.git"}
	withOne, withTwo := describe(t, nil), describe(t, nil)
	withOne.AddBinds(one)
	withTwo.AddBinds(two)
	one.GitDir, two.GitDir = true, true

	c := Diff(base, withOne)
	if c.NeedsRestart() || !slices.Equal(c.BindsAdded, []runtimes.Bind{one}) || len(c.BindsRemoved) != 0 {
		t.Errorf("adding a git directory: %+v", c)
	}
	c = Diff(withOne, withTwo)
	if c.NeedsRestart() || !slices.Equal(c.BindsAdded, []runtimes.Bind{two}) || !slices.Equal(c.BindsRemoved, []runtimes.Bind{one}) {
		t.Errorf("swapping git directories: %+v", c)
	}
	if c := Diff(withOne, withOne); c.NeedsRestart() || len(c.BindsAdded)+len(c.BindsRemoved) != 0 {
		t.Errorf("the same git directory: %+v", c)
	}
	// The same directory as a plain mount is a mount change, not a git one.
	plain := describe(t, nil)
	plain.Mounts = append(plain.Mounts, runtimes.Bind{Source: one.Source, Target: one.Target})
	if c := Diff(base, plain); !slices.Equal(c.Restart, []string{"mounts"}) || len(c.BindsAdded) != 0 {
		t.Errorf("a plain mount: %+v", c)
	}
}

func TestDiffAgainstAnUnreadableRecordRestarts(t *testing.T) {
	in := describe(t, nil)
	c := Diff(runtimes.Instance{Image: in.Image}, in)
	if !c.NeedsRestart() || c.Image {
		t.Errorf("Diff against an empty record = %+v, want a restart that keeps the root", c)
	}
}

// Every area comes from its mount tree in one recursive bind; no bind
// lands inside an area, where runc would resolve the destination through
// the agent's directories.
func TestMounts(t *testing.T) {
	in := describe(t, nil)
	got := Mounts(in, func(target string) string { return "/trees/x/current" + target })
	var dests []string
	for _, m := range got {
		dests = append(dests, m.Destination)
	}
	want := []string{"/tmp", "/workspace", "/memories", "/blocks", "/skills", "/tasks"}
	if !slices.Equal(dests, want) {
		t.Fatalf("mount destinations = %q, want %q", dests, want)
	}
	for _, m := range got {
		switch m.Destination {
		case "/blocks":
			if !slices.Contains(m.Options, "ro") || m.Source != "/trees/x/current/blocks" {
				t.Errorf("/blocks = %+v, want a read-only bind of its tree /trees/x/current/blocks", m)
			}
		case "/workspace":
			if !slices.Contains(m.Options, "rw") || !slices.Contains(m.Options, "rbind") || !slices.Contains(m.Options, "rprivate") ||
				m.Type != "bind" || m.Source != "/trees/x/current/workspace" {
				t.Errorf("%s = %+v, want a recursive private read-write bind of its tree", m.Destination, m)
			}
		case "/tmp":
			if m.Type != "tmpfs" || !slices.Contains(m.Options, "size=67108864") {
				t.Errorf("/tmp = %+v, want a 64 MiB tmpfs", m)
			}
		}
	}
}

// The custom mounts are in the workspace's tree, beneath it, and the git
// directory binds are not (they are bound into the running task).
func TestTreeHoldsTheCustomMountsBeneathTheWorkspace(t *testing.T) {
	in := describe(t, nil)
	in.Mounts = append(in.Mounts, runtimes.Bind{Source: "/projects/app/.git", Target: "/workspace/project/.git", GitDir: true})
	tr := mounttree.For(in)
	if tr.Workspace != "workspace" || len(tr.Areas) != len(in.Areas) {
		t.Fatalf("tree = %+v, want every area with the workspace named", tr)
	}
	if len(tr.Binds) != 1 || tr.Binds[0].Rel != "project" || tr.Owner != in.Identity.UID {
		t.Fatalf("tree binds = %+v, want only project, owned by the agent", tr.Binds)
	}
}

func TestLiveResourcesLiftUnsetLimits(t *testing.T) {
	res := liveResources(describe(t, nil), false)
	if *res.Memory.Limit != -1 || *res.CPU.Quota != -1 || *res.Pids.Limit != v1alpha1.DefaultPidsLimit {
		t.Errorf("unset limits = memory %d cpu quota %d pids %d, want -1 (unlimited) and the default pids limit %d", *res.Memory.Limit, *res.CPU.Quota, *res.Pids.Limit, v1alpha1.DefaultPidsLimit)
	}
	res = liveResources(describe(t, func(s *v1alpha1.SandboxSpec) {
		s.Containerd.MemoryLimit = ptr.To(resource.MustParse("128Mi"))
		s.Containerd.PidsLimit = ptr.To[int64](32)
	}), false)
	if *res.Memory.Limit != 128<<20 || *res.Pids.Limit != 32 {
		t.Errorf("limits = memory %d pids %d, want %d and 32", *res.Memory.Limit, *res.Pids.Limit, 128<<20)
	}
	res = liveResources(describe(t, func(s *v1alpha1.SandboxSpec) {
		s.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](16),
			Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("64Mi")), CPU: ptr.To(resource.MustParse("250m"))}}
		s.Containerd.MemoryLimit = ptr.To(resource.MustParse("128Mi"))
	}), false)
	if *res.Memory.Limit != 64<<20 || *res.Pids.Limit != 16 || *res.CPU.Quota != 25000 || *res.CPU.Period != 100000 {
		t.Errorf("spec.resources over the deprecated fields: memory %d pids %d cpu %d/%d, want %d, 16, 25000/100000", *res.Memory.Limit, *res.Pids.Limit, *res.CPU.Quota, *res.CPU.Period, 64<<20)
	}
}

// A CPU limit a tenant writes larger than any CFS quota the kernel takes
// is no quota, not one wrapped around to 1% of a CPU (the spec's value,
// 1,152,921,504,606,847 CPUs, passes admission where no class bounds it).
func TestHugeCPULimitIsNoQuota(t *testing.T) {
	in := describe(t, func(s *v1alpha1.SandboxSpec) {
		s.Resources = &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{CPU: ptr.To(resource.MustParse("1152921504606847"))}}
	})
	if q := *liveResources(in, false).CPU.Quota; q != -1 {
		t.Errorf("a limit of %d thousandths of a CPU: a CFS quota of %d µs; want none (-1)", in.Resources.CPUMillis, q)
	}
}

// Where the kernel accounts swap, the memory limit is that of memory and
// swap together (runc's swap limit), at creation and live: a process over
// it is killed, not swapped out. Where it does not, no swap limit is
// given, which runc would fail to write.
func TestMemoryLimitForbidsSwap(t *testing.T) {
	limited := describe(t, func(s *v1alpha1.SandboxSpec) {
		s.Resources = &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("64Mi"))}}
	})
	user, err := agentUser(limited)
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "unit")
	for _, swap := range []bool{true, false} {
		r := &Runtime{cfg: Config{Init: DefaultInit}, swap: swap}
		spec, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: limited.Name}, r.specOpts(limited, user)...)
		if err != nil {
			t.Fatal(err)
		}
		mem := spec.Linux.Resources.Memory
		if got := mem.Swap; swap && (got == nil || *got != 64<<20) || !swap && got != nil {
			t.Errorf("swap accounted %v: the spec's swap limit is %v, want the memory limit %d when accounted, none otherwise", swap, ptrString(got), 64<<20)
		}
		live := liveResources(limited, swap).Memory
		if got := live.Swap; swap && (got == nil || *got != 64<<20) || !swap && got != nil {
			t.Errorf("swap accounted %v: the live swap limit is %v, want the memory limit %d when accounted, none otherwise", swap, ptrString(got), 64<<20)
		}
	}
	if got := liveResources(describe(t, nil), true).Memory.Swap; got == nil || *got != -1 {
		t.Errorf("no memory limit: the live swap limit is %v, want -1 (lifted with it)", ptrString(got))
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatInt(*p, 10)
}

func TestInstanceRecordRoundTrips(t *testing.T) {
	in := describe(t, func(s *v1alpha1.SandboxSpec) { s.Env.Passthrough = []v1alpha1.EnvVarName{"TOKEN"} })
	ext, err := encodeInstance(in)
	if err != nil {
		t.Fatal(err)
	}
	info := containerInfo(in, ext)
	got, err := decodeInstance(info)
	if err != nil {
		t.Fatal(err)
	}
	if got.ConfigHash != in.ConfigHash || !slices.Equal(got.Binaries, in.Binaries) || !slices.Equal(got.Env, in.Env) || Diff(got, in).NeedsRestart() {
		t.Errorf("decoded %+v, want %+v", got, in)
	}
}

func TestFindMount(t *testing.T) {
	const table = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
1404 1380 0:150 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/c/snapshots/2/fs:/var/lib/c/snapshots/1/fs,upperdir=/var/lib/c/snapshots/3/fs,workdir=/var/lib/c/snapshots/3/work
1405 1404 0:151 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1406 1404 8:1 /areas/alice/my\040notes /workspace/my\040notes rw,nosuid,nodev master:1 - ext4 /dev/vda rw
`
	tests := []struct {
		name, point, fstype string
		lower               []string
		found               bool
	}{
		{name: "the top mount at / wins", point: "/", fstype: "overlay", found: true,
			lower: []string{"/var/lib/c/snapshots/2/fs", "/var/lib/c/snapshots/1/fs"}},
		{name: "octal escapes are undone", point: "/workspace/my notes", fstype: "ext4", found: true},
		{name: "absent mount point", point: "/nowhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok, err := FindMount(strings.NewReader(table), tt.point)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tt.found || m.FSType != tt.fstype || !slices.Equal(m.LowerDirs(), tt.lower) {
				t.Errorf("FindMount(%q) = %+v, %v; want fstype %q lower %q found %v", tt.point, m, ok, tt.fstype, tt.lower, tt.found)
			}
		})
	}
}

func TestLowerDirForms(t *testing.T) {
	tests := []struct {
		name string
		opts []string
		want []string
	}{
		{name: "colon list", opts: []string{"lowerdir=/a:/b"}, want: []string{"/a", "/b"}},
		{name: "escaped colon", opts: []string{`lowerdir=/a\:x:/b`}, want: []string{"/a:x", "/b"}},
		{name: "one per option", opts: []string{"lowerdir+=/a", "lowerdir+=/b", "datadir+=/d"}, want: []string{"/a", "/b"}},
		{name: "none", opts: []string{"rw"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (MountInfo{SuperOptions: tt.opts}).LowerDirs(); !slices.Equal(got, tt.want) {
				t.Errorf("LowerDirs(%q) = %q, want %q", tt.opts, got, tt.want)
			}
		})
	}
}

func TestFindMountRefusesAMalformedTable(t *testing.T) {
	if _, _, err := FindMount(strings.NewReader("1 2 3\n"), "/"); err == nil {
		t.Error("a malformed line was accepted")
	}
}

func containerInfo(in runtimes.Instance, ext *jsonAny) containers.Container {
	return containers.Container{ID: in.Name, Labels: labels(in), Extensions: map[string]typeurl.Any{instanceExtension: ext}}
}

func TestDiffRestartsForANewIdentity(t *testing.T) {
	base := describe(t, nil)
	moved := base
	moved.Identity = runtimes.Identity{UID: base.Identity.UID + 1, GID: base.Identity.GID + 1}
	if c := Diff(base, moved); len(c.Restart) != 1 || !strings.HasPrefix(c.Restart[0], "identity ") {
		t.Errorf("Diff with another identity = %+v, want a restart naming the identity", c)
	}
}

// TestSpecRunsTheAgentUnprivileged: the container's process, which every
// command copies, is the agent's identity without supplementary groups,
// capabilities or new privileges, under containerd's default seccomp
// profile.
func TestSpecRunsTheAgentUnprivileged(t *testing.T) {
	in := describe(t, func(s *v1alpha1.SandboxSpec) { s.Devices.All = true })
	in.Identity = runtimes.Identity{UID: 2000000007, GID: 2000000007}
	user, err := agentUser(in)
	if err != nil {
		t.Fatal(err)
	}
	r := &Runtime{cfg: Config{Init: DefaultInit}}
	ctx := namespaces.WithNamespace(context.Background(), "unit")
	spec, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: in.Name}, r.specOpts(in, user)...)
	if err != nil {
		t.Fatal(err)
	}
	p := spec.Process
	if p.User.UID != in.Identity.UID || p.User.GID != in.Identity.GID || slices.ContainsFunc(p.User.AdditionalGids, func(g uint32) bool { return g != in.Identity.GID }) {
		t.Errorf("user = %+v, want uid and gid %d and no other group", p.User, in.Identity.UID)
	}
	if !p.NoNewPrivileges {
		t.Error("no_new_privs is not set")
	}
	if c := p.Capabilities; c == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) > 0 {
		t.Errorf("capabilities = %+v, want none", c)
	}
	if spec.Linux.Seccomp == nil || spec.Linux.Seccomp.DefaultAction != specs.ActErrno || len(spec.Linux.Seccomp.Syscalls) == 0 {
		t.Errorf("seccomp = %+v, want containerd's default profile (deny by default)", spec.Linux.Seccomp)
	}
}

func TestRootIdentityIsRefused(t *testing.T) {
	for _, id := range []runtimes.Identity{{}, {UID: 0, GID: 2000000000}, {UID: 2000000000, GID: 0}} {
		in := describe(t, nil)
		in.Identity = id
		if _, err := agentUser(in); err == nil || !strings.Contains(err.Error(), "never run as host root") {
			t.Errorf("agentUser(%+v) = %v, want a refusal", id, err)
		}
		r := &Runtime{cfg: Config{LookupEnv: func(string) (string, bool) { return "", false }}}
		ext, err := encodeInstance(in)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.command(containerInfo(in, ext), in, []string{"sh"}); !errors.Is(err, policy.ErrRefused) {
			t.Errorf("a command recorded for identity %+v: %v, want refused", id, err)
		}
	}
}
