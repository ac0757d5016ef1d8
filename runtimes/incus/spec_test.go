package incus

import (
	"errors"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
)

func TestRawIdmapMapsTheAgentToItself(t *testing.T) {
	tests := []struct {
		name string
		id   runtimes.Identity
		want string
	}{
		{"one id for user and group", runtimes.Identity{UID: 2000000003, GID: 2000000003}, "both 2000000003 2000000003"},
		{"different uid and gid map separately", runtimes.Identity{UID: 2000000003, GID: 2000000004}, "uid 2000000003 2000000003\ngid 2000000004 2000000004"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RawIdmap(tt.id); got != tt.want {
				t.Fatalf("raw.idmap %q, want %q", got, tt.want)
			}
		})
	}
}

// TestRootIdentityIsRefused: host root is never mapped into a container nor
// run as, whether asked for by Ensure or found in an instance's record.
func TestRootIdentityIsRefused(t *testing.T) {
	r, err := New(Config{Socket: "/nonexistent/unix.socket"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []runtimes.Identity{{}, {UID: 0, GID: 2000000000}, {UID: 2000000000, GID: 0}} {
		in := runtimes.Instance{Name: "cireilclaw-root", Image: "busybox", Incus: &runtimes.IncusConfig{}, Identity: id}
		_, err := r.Ensure(t.Context(), in)
		if runtimes.ReasonOf(err) != runtimes.ReasonRefused || !strings.Contains(err.Error(), "never run as host root") {
			t.Errorf("Ensure with identity %+v: %v, want %v", id, err, runtimes.ReasonRefused)
		}
		if _, err := agentIdentity(in); err == nil {
			t.Errorf("agentIdentity(%+v) accepted it", id)
		}
	}
}

func TestDevices(t *testing.T) {
	in := runtimes.Instance{
		Areas: []runtimes.Bind{
			{Source: "/a/alice/workspace", Target: "/workspace"},
			{Source: "/a/alice/blocks", Target: "/blocks", ReadOnly: true},
		},
		Mounts: []runtimes.Bind{{Source: "/src/app", Target: "/workspace/app", ReadOnly: true}},
	}
	devs, err := Devices(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 3 {
		t.Fatalf("want 3 devices, got %v", devs)
	}
	for name, d := range devs {
		if !strings.HasPrefix(name, DevicePrefix) || d["type"] != "disk" {
			t.Fatalf("device %s: %v", name, d)
		}
	}
	if d := devs[DeviceName("/blocks")]; d["readonly"] != "true" || d["source"] != "/a/alice/blocks" {
		t.Fatalf("blocks device %v", d)
	}
	if d := devs[DeviceName("/workspace/app")]; d["readonly"] != "true" || d["path"] != "/workspace/app" {
		t.Fatalf("mount device %v", d)
	}
	if _, ok := devs[DeviceName("/workspace")]["readonly"]; ok {
		t.Fatal("workspace must be writable")
	}

	in.Devices = runtimes.Devices{USB: true}
	if devs, _ = Devices(in); devs[usbDevice]["type"] != "usb" {
		t.Fatalf("usb device missing: %v", devs)
	}
	in.Devices = runtimes.Devices{All: true}
	if _, err := Devices(in); err == nil || !strings.Contains(err.Error(), "profile") {
		t.Fatalf("devices.all should be refused with a way out, got %v", err)
	}
}

func TestDeviceNamesAreUniquePerTarget(t *testing.T) {
	a, b := DeviceName("/workspace/a-b"), DeviceName("/workspace/a/b")
	if a == b {
		t.Fatalf("%s and %s collide", a, b)
	}
	if long := DeviceName("/workspace/" + strings.Repeat("x", 200)); len(long) > 64 {
		t.Fatalf("device name too long: %d", len(long))
	}
}

func TestMergeDevicesKeepsForeignDevices(t *testing.T) {
	current := map[string]incusapi.Device{
		"root":                   {"type": "disk", "path": "/", "pool": "default"},
		DeviceName("/old"):       {"type": "disk", "path": "/old"},
		DeviceName("/workspace"): {"type": "disk", "path": "/workspace", "source": "/x"},
	}
	want := map[string]incusapi.Device{DeviceName("/workspace"): {"type": "disk", "path": "/workspace", "source": "/y"}}
	got := mergeDevices(current, want)
	if _, ok := got["root"]; !ok {
		t.Fatal("the profile's root device was dropped")
	}
	if _, ok := got[DeviceName("/old")]; ok {
		t.Fatal("a removed mount was kept")
	}
	if got[DeviceName("/workspace")]["source"] != "/y" {
		t.Fatal("a changed mount was not updated")
	}
	if !devicesEqual(ownDevices(got), want) {
		t.Fatalf("own devices %v, want %v", ownDevices(got), want)
	}
}

func TestDiff(t *testing.T) {
	old := runtimes.Instance{Image: "a", Mounts: []runtimes.Bind{{Source: "/x", Target: "/workspace/x"}}}
	live := old
	live.Mounts = nil
	live.Binaries = []string{"git"}
	if c := Diff(old, live, "both 0 1000", "both 0 1000"); c.NeedsRestart() {
		t.Fatalf("mounts and the allowlist apply live, got %v", c.Restart)
	}
	img := old
	img.Image = "b"
	if c := Diff(old, img, "", ""); !c.Image || !strings.Contains(c.String(), `"a" → "b"`) {
		t.Fatalf("image change: %+v", c)
	}
	if c := Diff(old, old, "both 0 1000", "both 5 5"); !c.NeedsRestart() || c.String() != "raw.idmap" {
		t.Fatalf("identity change: %+v", c)
	}
}

func TestImageSource(t *testing.T) {
	r, err := New(Config{Socket: "/nonexistent/unix.socket"})
	if err != nil {
		t.Fatal(err)
	}
	src, remote, err := r.imageSource("images:debian/12")
	if err != nil || !remote || src.Alias != "debian/12" || src.Protocol != "simplestreams" || src.Mode != "pull" {
		t.Fatalf("remote image: %+v %v %v", src, remote, err)
	}
	if src, remote, err = r.imageSource("sandbox-busybox"); err != nil || remote || src.Alias != "sandbox-busybox" {
		t.Fatalf("local alias: %+v %v %v", src, remote, err)
	}
	if _, _, err = r.imageSource("nowhere:x"); err == nil || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Fatalf("unknown remote: %v", err)
	}
}

func TestNewNeverDialsTheDaemon(t *testing.T) {
	r, err := New(Config{Socket: "/nonexistent/unix.socket"})
	if err != nil {
		t.Fatalf("a daemon that is down must not fail the constructor: %v", err)
	}
	if _, err := New(Config{Socket: "relative.socket"}); err == nil {
		t.Fatal("a relative socket path can never work and should be refused")
	}
	_, err = r.Inspect(t.Context(), "cireilclaw-x")
	if runtimes.ReasonOf(err) != runtimes.ReasonUnavailable || !strings.Contains(err.Error(), "/nonexistent/unix.socket") {
		t.Fatalf("want RuntimeUnavailable naming the socket, got %v", err)
	}
}

func TestRestrictedProjectSaysWhatToPermit(t *testing.T) {
	r, _ := New(Config{Socket: "/nonexistent/unix.socket"})
	in := runtimes.Instance{Name: "cireilclaw-a", AgentDir: "/areas/a", Mounts: []runtimes.Bind{{Source: "/src"}},
		Identity: runtimes.Identity{UID: 2000000001, GID: 2000000001}}
	tests := []struct {
		daemon string
		reason runtimes.Reason
		want   []string
	}{
		{`Failed checking if instance creation allowed: Use of low-level "raw.idmap" element 0 on container "x" of project "p" is forbidden`,
			runtimes.ReasonIdmapNotPermitted, []string{"restricted.idmap.uid=2000000001", "restricted.idmap.gid=2000000001", `project "p"`}},
		// Whichever low-level key the daemon meets first: one setting
		// permits them all.
		{`Failed checking if instance creation allowed: Use of low-level config "raw.lxc" on container "x" of project "p" is forbidden`,
			runtimes.ReasonHardeningNotPermitted, []string{"restricted.containers.lowlevel=allow"}},
		{`Failed checking if instance creation allowed: Use of low-level config "limits.memory.swap" on container "x" of project "p" is forbidden`,
			runtimes.ReasonHardeningNotPermitted, []string{"restricted.containers.lowlevel=allow"}},
		{`Failed checking if instance creation allowed: Invalid device "d" on container "x" of project "p": Attaching disks not backed by a pool is forbidden`,
			runtimes.ReasonHostDisksNotPermitted, []string{"restricted.devices.disk=allow", "restricted.devices.disk.paths=" + DefaultHeldDir}},
	}
	for _, tt := range tests {
		err := r.restricted("ensuring instance", in, "p", errors.New(tt.daemon))
		if runtimes.ReasonOf(err) != tt.reason {
			t.Fatalf("reason %v for %q", runtimes.ReasonOf(err), tt.daemon)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%v should contain %q", err, w)
			}
		}
	}
	if err := r.restricted("x", in, "p", errors.New("Instance not found")); err != nil {
		t.Fatalf("an unrelated error is not a restriction: %v", err)
	}
}

func TestUsageHealth(t *testing.T) {
	pool := incusapi.StoragePool{Name: "default", Driver: "btrfs", Status: "Created"}
	used := func(n uint64) func() (incusapi.VolumeState, error) {
		return func() (incusapi.VolumeState, error) {
			return incusapi.VolumeState{Usage: &incusapi.VolumeUsage{Used: n}}, nil
		}
	}
	tests := []struct {
		name   string
		limit  int64
		state  func() (incusapi.VolumeState, error)
		reason runtimes.Reason
	}{
		{"no limit", 0, nil, runtimes.ReasonHealthy},
		{"within the limit", 100, used(50), runtimes.ReasonHealthy},
		{"over the limit", 100, used(150), runtimes.ReasonUpperDirOverLimit},
		{"a pool without quotas cannot enforce it", 100, func() (incusapi.VolumeState, error) { return incusapi.VolumeState{}, nil }, runtimes.ReasonSizeLimitNotEnforced},
		{"usage unreadable", 100, func() (incusapi.VolumeState, error) { return incusapi.VolumeState{}, errors.New("boom") }, runtimes.ReasonNotMounted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := usageHealth("cireilclaw-a", pool, tt.limit, tt.state)
			if h.Reason != tt.reason || h.Healthy != (tt.reason == runtimes.ReasonHealthy) {
				t.Fatalf("got %+v, want reason %v", h, tt.reason)
			}
		})
	}
}

// A rootSizeLimit becomes the size of the instance's own root disk device:
// the profile's device, overridden, once.
func TestRootOverride(t *testing.T) {
	inst := &incusapi.Instance{
		ExpandedDevices: map[string]incusapi.Device{
			"root":           {"type": "disk", "path": "/", "pool": "fast"},
			"sandbox-x-1234": {"type": "disk", "path": "/workspace", "source": "/h"},
		},
		Devices: map[string]incusapi.Device{},
	}
	if _, _, ok := rootOverride(inst, 0); ok {
		t.Fatal("no limit asked for a root override")
	}
	name, d, ok := rootOverride(inst, 64<<20)
	if !ok || name != "root" || d["pool"] != "fast" || d["path"] != "/" || d["type"] != "disk" || d["size"] != "67108864" {
		t.Fatalf("rootOverride = %q %v %v", name, d, ok)
	}
	if inst.ExpandedDevices["root"]["size"] != "" {
		t.Fatal("the profile's device was changed in place")
	}
	inst.Devices["root"] = d
	if _, _, ok := rootOverride(inst, 64<<20); ok {
		t.Fatal("an instance with the size already asked for it again")
	}
	if _, d, ok := rootOverride(inst, 128<<20); !ok || d["size"] != "134217728" {
		t.Fatalf("a new limit: %v %v", d, ok)
	}
}

func TestCurrentProjectFromClientConfig(t *testing.T) {
	tests := []struct {
		name, yml, want string
	}{
		{"switched project on the local remote", "default-remote: local\nremotes:\n  local:\n    addr: unix://\n    project: agents\n", "agents"},
		{"no project recorded", "remotes:\n  local:\n    addr: unix://\n", ""},
		{"default remote elsewhere says nothing of the local daemon", "default-remote: far\nremotes:\n  far:\n    addr: https://far:8443\n    project: x\n", ""},
		{"garbage", ":::", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := projectIn([]byte(tt.yml)); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// LXC refuses a disk device whose destination's path holds a link; the
// start's failure says so instead of "forkstart exited".
func TestStartRefusalNamesALinkedMountDestination(t *testing.T) {
	in := runtimes.Instance{Name: "cireilclaw-a"}
	log := `lxc a 2026 ERROR    utils - ../src/lxc/utils.c:open_without_symlink:1084 - Too many levels of symbolic links - src in /usr/lib/x86_64-linux-gnu/lxc/rootfs/workspace/src/app was a symbolic link!
lxc a 2026 ERROR    conf - ../src/lxc/conf.c:mount_entry:2446 - Too many levels of symbolic links - Failed to mount "/var/lib/incus/devices/a/disk.app" on "/usr/lib/x86_64-linux-gnu/lxc/rootfs/workspace/src/app"`
	err := startRefusal("ensuring instance", in, log)
	if err == nil || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), "workspace/src/app") {
		t.Fatalf("got %v, want a refusal naming the link and the destination", err)
	}
}

func TestStartRefusalNamesTheDelegation(t *testing.T) {
	in := runtimes.Instance{Name: "cireilclaw-a", Identity: runtimes.Identity{UID: 2000000005, GID: 2000000005}}
	tests := []struct {
		name, log string
		refused   bool
	}{
		{"newuidmap refuses the agent's range", `lxc a 2026 ERROR    conf - ../src/lxc/conf.c:lxc_map_ids:3708 - newuidmap failed to write mapping "newuidmap: uid range [2000000005-2000000006) -> [2000000005-2000000006) not allowed": newuidmap 2093 0 1000000 1000000000 2000000005 2000000005 1
lxc a 2026 ERROR    start - ../src/lxc/start.c:lxc_spawn:1788 - Failed to set up id mapping.`, true},
		{"newgidmap refuses it", `ERROR conf - newgidmap failed to write mapping "newgidmap: gid range [2000000005-2000000006) -> [2000000005-2000000006) not allowed"`, true},
		{"another failure", `ERROR start - Failed to spawn container "a"`, false},
		{"no log", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := startRefusal("ensuring instance", in, tt.log)
			if !tt.refused {
				if err != nil {
					t.Fatalf("refusal from an unrelated log: %v", err)
				}
				return
			}
			if runtimes.ReasonOf(err) != runtimes.ReasonIdmapNotPermitted || !strings.Contains(err.Error(), "/etc/subuid") || !strings.Contains(err.Error(), "2000000005") {
				t.Fatalf("got %v, want %v naming /etc/subuid and the agent's id", err, runtimes.ReasonIdmapNotPermitted)
			}
		})
	}
}

// A memory limit forbids swap beyond it, and a limit lifted lifts that
// too (Incus's default, swap allowed, where there is no memory limit).
func TestMemoryLimitForbidsSwap(t *testing.T) {
	tests := []struct {
		name      string
		resources runtimes.Resources
		memory    string
		swap      string
	}{
		{"memory limited", runtimes.Resources{MemoryBytes: 128 << 20, Pids: 64}, "134217728", "false"},
		{"no memory limit", runtimes.Resources{Pids: 64}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := limitsConfig(tt.resources)
			swap, ok := c["limits.memory.swap"]
			if c["limits.memory"] != tt.memory || !ok || swap != tt.swap {
				t.Fatalf("limits.memory = %q, limits.memory.swap = %q (set %v); want %q and %q, set", c["limits.memory"], swap, ok, tt.memory, tt.swap)
			}
		})
	}
}

// A CPU limit becomes a CFS allowance by the rule cgroup.CFSQuota gives
// the other backends: one beyond the kernel's largest quota (176 million
// CPUs, which no host has) is no allowance, never a figure Incus cannot
// read as a duration or the kernel refuses.
func TestCPULimitBecomesAnAllowance(t *testing.T) {
	tests := []struct {
		name   string
		millis int64
		want   string
	}{
		{"no limit", 0, ""},
		{"a thousandth of a CPU", 1, "1ms/100ms"},
		{"half a CPU", 500, "50ms/100ms"},
		{"two CPUs", 2000, "200ms/100ms"},
		{"the largest quota", 175921860000, "17592186000ms/100ms"},
		{"200 million CPUs", 200_000_000_000, ""},
		{"2^60 thousandths", 1 << 60, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := limitsConfig(runtimes.Resources{Pids: 64, CPUMillis: tt.millis})["limits.cpu.allowance"]
			if !ok || got != tt.want {
				t.Fatalf("limits.cpu.allowance = %q (set %v); want %q, set", got, ok, tt.want)
			}
		})
	}
}
