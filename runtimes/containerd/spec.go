package containerd

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"reflect"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

// Labels and extensions on every container the driver makes. The owner
// label holds the <namespace>/<name> of the Sandbox, so orphans are found by
// it; the hash label says which configuration the container was last
// converged to.
const (
	OwnerLabel = "sandbox.cireilclaw.dev/owner"
	HashLabel  = "sandbox.cireilclaw.dev/config-hash"
	// instanceExtension holds the Instance the container was converged to:
	// Exec reads the allowlist and passthrough names from it, and a changed
	// spec is compared with it to say what changed.
	instanceExtension = "sandbox.cireilclaw.dev/instance"
	instanceTypeURL   = "sandbox.cireilclaw.dev/v1alpha1/Instance"
)

// TmpSize is the size of the container's /tmp tmpfs (64 MiB). It is memory:
// it counts against the memory limit.
const TmpSize = 64 << 20

// Host paths the device options expose.
const (
	usbDevices = "/dev/bus/usb"
	// udevData is udev's device database, which USB libraries read to name
	// devices.
	udevData = "/run/udev/data"
)

// jsonAny carries the Instance as a container extension without
// registering a Go type with containerd's type registry.
type jsonAny struct {
	url   string
	value []byte
}

func (a *jsonAny) GetTypeUrl() string { return a.url }
func (a *jsonAny) GetValue() []byte   { return a.value }

func encodeInstance(in runtimes.Instance) (*jsonAny, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encoding the instance description: %w", err)
	}
	return &jsonAny{url: instanceTypeURL, value: b}, nil
}

// decodeInstance reads the Instance a container was converged to. The
// ConfigHash comes from the hash label, because it is not part of the JSON.
func decodeInstance(info containers.Container) (runtimes.Instance, error) {
	ext, ok := info.Extensions[instanceExtension]
	if !ok || ext == nil {
		return runtimes.Instance{}, fmt.Errorf("container %s has no %s extension", info.ID, instanceExtension)
	}
	var in runtimes.Instance
	if err := json.Unmarshal(ext.GetValue(), &in); err != nil {
		return runtimes.Instance{}, fmt.Errorf("container %s: decoding its %s extension: %w", info.ID, instanceExtension, err)
	}
	in.ConfigHash = info.Labels[HashLabel]
	return in, nil
}

func labels(in runtimes.Instance) map[string]string {
	return map[string]string{OwnerLabel: in.Owner, HashLabel: in.ConfigHash}
}

// specOpts describe the container: the long-running init in /workspace as
// the agent's own unprivileged host identity (no supplementary groups), no
// capabilities, no new privileges, containerd's default seccomp profile;
// the areas and mounts bound with their modes, a 64 MiB /tmp, the devices
// the spec opts into and the limits it sets. The rest is containerd's
// default spec: its own pid, mount, network (loopback only, unless the
// instance has an egress namespace, which it joins), IPC and UTS
// namespaces. Every command is run with the init's process settings
// (command), so they hold for each of them too.
func (r *Runtime) specOpts(in runtimes.Instance, user specs.User) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithProcessArgs(r.cfg.Init...),
		oci.WithProcessCwd(policy.SandboxHome),
		oci.WithEnv([]string{"PATH=" + policy.MinimalPath, "HOME=" + policy.SandboxHome}),
		oci.WithHostname(in.Name),
		oci.WithUIDGID(user.UID, user.GID),
		oci.WithNoNewPrivileges,
		// A process that is not uid 0 still keeps the capabilities the
		// spec lists (runc sets them after switching user): list none.
		oci.WithCapabilities(nil),
		oci.WithAmbientCapabilities(nil),
		oci.WithMounts(Mounts(in, func(target string) string { return r.AreaSource(in.Name, target) })),
	}
	if l := memoryLimit(in); l > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(l)))
		if r.swap {
			// runc's swap limit is of memory and swap together: none
			// beyond the memory limit, so a process over it is killed,
			// not swapped out.
			opts = append(opts, oci.WithMemorySwap(l))
		}
	}
	if l := pidsLimit(in); l > 0 {
		opts = append(opts, oci.WithPidsLimit(l))
	}
	if q := cpuQuota(in); q > 0 {
		opts = append(opts, oci.WithCPUCFS(q, cpuPeriod))
	}
	if n := networkOf(in); n != "" {
		// The Sandbox's egress namespace, whose only way out is its proxy,
		// in place of a new one with loopback alone.
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: n}))
	}
	if in.Pod != nil {
		// On a cluster: in the Sandbox's Pod's cgroup, which the kubelet
		// accounts.
		opts = append(opts, oci.WithCgroup(podCgroupsPath(in)))
	}
	switch {
	case in.Devices.All:
		opts = append(opts, oci.WithHostDevices, oci.WithAllDevicesAllowed)
	case in.Devices.USB:
		// A host without a USB bus has no devices to give.
		if _, err := os.Stat(usbDevices); err == nil {
			opts = append(opts, oci.WithDevices(usbDevices, "", "rwm"))
		}
	}
	// The profile follows the capabilities it is derived from: last.
	return append(opts, seccomp.WithDefaultProfile())
}

// podCgroupsPath is the cgroupsPath of in's container, right below the
// cgroup of its Pod's container (its Pod's, on cgroup v2): a path, as runc
// takes it with its cgroupfs driver, which the driver's runtime options
// (none) leave it on, whichever driver the kubelet uses.
func podCgroupsPath(in runtimes.Instance) string {
	return path.Join(in.Pod.Cgroup, podCgroupName(in.Name))
}

// podCgroupName is the name of instance name's cgroup below its Pod's.
func podCgroupName(name string) string { return "sandbox-" + name }

// networkOf is the network namespace in's container joins; empty: a new
// one.
func networkOf(in runtimes.Instance) string {
	if in.Network == nil {
		return ""
	}
	return in.Network.Namespace
}

// agentUser is who the init and every command run as: the agent's host
// identity, never root.
func agentUser(in runtimes.Instance) (specs.User, error) {
	if in.Identity.UID == 0 || in.Identity.GID == 0 {
		return specs.User{}, fmt.Errorf("the agent's host identity is uid %d gid %d: agent commands never run as host root (uid or gid 0)",
			in.Identity.UID, in.Identity.GID)
	}
	return specs.User{UID: in.Identity.UID, GID: in.Identity.GID}, nil
}

// Mounts are the container's mounts beyond containerd's defaults: /tmp,
// then each standard area in one recursive bind from areaSource(target),
// its mount tree (trees.go), which holds the custom mounts beneath the
// workspace already, and udev's database read-only when devices are
// exposed. No bind lands inside an area: runc would resolve such a
// destination through directories the agent writes. The binds are
// rprivate, so detaching a host tree never reaches a running container's
// copy. The git directories of worktrees are not among them: they are
// bound after the task starts, from handles (runtimes/mountns).
func Mounts(in runtimes.Instance, areaSource func(target string) string) []specs.Mount {
	out := []specs.Mount{{
		Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", TmpSize)},
	}}
	for _, b := range in.Areas {
		mode := "rw"
		if b.ReadOnly {
			mode = "ro"
		}
		out = append(out, specs.Mount{
			Destination: b.Target, Type: "bind", Source: areaSource(b.Target),
			Options: []string{"rbind", "rprivate", "nosuid", "nodev", mode},
		})
	}
	if in.Devices.USB || in.Devices.All {
		if _, err := os.Stat(udevData); err == nil {
			out = append(out, specs.Mount{
				Destination: udevData, Type: "bind", Source: udevData,
				Options: []string{"rbind", "nosuid", "nodev", "noexec", "ro"},
			})
		}
	}
	return out
}

// The limits are the instance's resources (spec.resources, the class's,
// the deprecated containerd fields folded in by the describer).
func memoryLimit(in runtimes.Instance) int64 { return in.Resources.MemoryBytes }

func pidsLimit(in runtimes.Instance) int64 { return in.Resources.Pids }

// cpuPeriod is the CFS period a CPU limit is a quota of.
const cpuPeriod = 100000

// cpuQuota is the CFS quota of the instance's CPU limit; 0 for none.
func cpuQuota(in runtimes.Instance) int64 {
	return cgroup.CFSQuota(in.Resources.CPUMillis, cpuPeriod)
}

func rootfsLimit(in runtimes.Instance) int64 {
	if in.Containerd == nil {
		return 0
	}
	return in.Containerd.RootfsSizeLimit.BytesOf()
}

// liveResources are the limits of in as a running task takes them: an
// unset limit is -1, which lifts one set before. swap says the kernel
// accounts swap: the memory limit is then that of memory and swap
// together too, as specOpts sets it.
func liveResources(in runtimes.Instance, swap bool) *specs.LinuxResources {
	mem, pids := int64(-1), int64(-1)
	if l := memoryLimit(in); l > 0 {
		mem = l
	}
	if l := pidsLimit(in); l > 0 {
		pids = l
	}
	quota, period := int64(-1), uint64(cpuPeriod)
	if q := cpuQuota(in); q > 0 {
		quota = q
	}
	res := &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &mem}, Pids: &specs.LinuxPids{Limit: &pids},
		CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}}
	if swap {
		res.Memory.Swap = &mem
	}
	return res
}

// Change is what differs between the configuration a container was
// converged to and the one asked for.
type Change struct {
	// Restart lists what a running container cannot take live, for the
	// RestartRequired message; empty when everything applies live.
	Restart []string
	// Image is set when the image changed: the writable root is made anew
	// from the new image, so container-local state does not carry over.
	Image bool
	// Limits is set when the memory or pids limit changed; a running task
	// takes them live.
	Limits bool
	// BindsAdded and BindsRemoved are git directory binds of session
	// worktrees; a running task takes them live.
	BindsAdded, BindsRemoved []runtimes.Bind
}

// NeedsRestart says whether a running container must stop to take the change.
func (c Change) NeedsRestart() bool { return len(c.Restart) > 0 }

func (c Change) String() string { return strings.Join(c.Restart, ", ") }

// Diff says what changed from old to new. The allowlist, the passthrough
// names and the rootfs size limit are read at each command or health check,
// so they never need a restart.
func Diff(old, new runtimes.Instance) Change {
	var c Change
	if old.Image != new.Image {
		c.Image = true
		c.Restart = append(c.Restart, fmt.Sprintf("image %q → %q", old.Image, new.Image))
	}
	if old.AgentDir != new.AgentDir || !sameBinds(old.Areas, new.Areas) {
		c.Restart = append(c.Restart, "areas")
	}
	if !sameBinds(withoutSizeLimits(plainMounts(old)), withoutSizeLimits(plainMounts(new))) {
		c.Restart = append(c.Restart, "mounts")
	}
	c.BindsAdded, c.BindsRemoved = runtimes.DiffGitDirs(old, new)
	if old.Devices != new.Devices {
		c.Restart = append(c.Restart, "devices")
	}
	if networkOf(old) != networkOf(new) {
		c.Restart = append(c.Restart, fmt.Sprintf("network namespace %q → %q", networkOf(old), networkOf(new)))
	}
	if old.Identity != new.Identity {
		c.Restart = append(c.Restart, fmt.Sprintf("identity %d:%d → %d:%d", old.Identity.UID, old.Identity.GID, new.Identity.UID, new.Identity.GID))
	}
	c.Limits = memoryLimit(old) != memoryLimit(new) || pidsLimit(old) != pidsLimit(new) || cpuQuota(old) != cpuQuota(new)
	return c
}

// withoutSizeLimits drops the size limits of overlay mounts, which the
// health check reads and no mount depends on.
func withoutSizeLimits(binds []runtimes.Bind) []runtimes.Bind {
	out := slices.Clone(binds)
	for i, b := range out {
		if b.Overlay != nil {
			l := *b.Overlay
			l.SizeLimit = 0
			out[i].Overlay = &l
		}
	}
	return out
}

// plainMounts are the mounts of in other than git directory binds.
func plainMounts(in runtimes.Instance) []runtimes.Bind {
	var out []runtimes.Bind
	for _, b := range in.Mounts {
		if !b.GitDir {
			out = append(out, b)
		}
	}
	return out
}

// sameBinds compares binds by content: a Bind read back from a container's
// record has its own copies of anything it points to.
func sameBinds(a, b []runtimes.Bind) bool {
	return slices.EqualFunc(a, b, func(x, y runtimes.Bind) bool { return reflect.DeepEqual(x, y) })
}
