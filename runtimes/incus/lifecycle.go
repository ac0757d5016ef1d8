package incus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
	"github.com/cireilclaw/sandbox-controller/runtimes/mountns"
)

// Ensure creates the instance if it is absent and starts it if it is
// stopped. A changed description is applied live where Incus can (disk
// devices are added, updated and removed on the running container); an
// image or identity change on a running instance is reported as
// RestartRequired and applied, by rebuilding the root from the new image,
// the next time the instance is ensured while stopped.
func (r *Runtime) Ensure(ctx context.Context, in runtimes.Instance) (runtimes.State, error) {
	const op = "ensuring instance"
	if in.Incus == nil || in.Image == "" {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "the instance has no incus image")
	}
	id, err := agentIdentity(in)
	if err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonRefused, op, in.Name, "%w", err)
	}
	want, err := r.devices(in)
	if err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "%w", err)
	}
	// Say which mount source a bind cannot use before the runtime fails
	// on it in its own words.
	if err := runtimes.CheckMountSources(in); err != nil {
		return runtimes.State{}, err
	}
	// The disk devices need their sources on the host, overlay mounts
	// their merged views.
	if err := in.LayoutAreas(); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "%w", err)
	}
	if err := runtimes.MountOverlays(nil, in); err != nil {
		return runtimes.State{}, err
	}
	if err := r.holdSources(in); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonMountSourceMissing, op, in.Name, "%w", err)
	}
	project := r.projectOf(in)
	cl := r.client.InProject(project)
	r.remember(in.Name, project)

	inst, etag, err := cl.GetInstance(ctx, in.Name)
	if incusapi.IsNotFound(err) {
		if err = r.create(ctx, cl, in, want); err == nil || incusapi.IsConflict(err) {
			// A conflict is a create that raced ours: take what is there.
			inst, etag, err = cl.GetInstance(ctx, in.Name)
		}
	}
	if err != nil {
		if inst == nil {
			// Nothing was made that uses the sources held for it.
			_ = r.releaseSources(in.Name)
		}
		if re := r.restricted(op, in, project, err); re != nil {
			return runtimes.State{}, re
		}
		return runtimes.State{}, r.fail(op, in.Name, err)
	}
	if err := checkOwner(inst, in.Owner); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonNameConflict, op, in.Name, "%w", err)
	}
	if masks := foreignDevices(inst); len(masks) > 0 {
		// Before the instance starts (or, made before this check, while it
		// runs: Incus removes them live).
		put := inst.Writable()
		put.Devices = maps.Clone(put.Devices)
		if put.Devices == nil {
			put.Devices = map[string]incusapi.Device{}
		}
		for _, name := range masks {
			put.Devices[name] = incusapi.Device{"type": "none"}
		}
		if err := cl.UpdateInstance(ctx, in.Name, put, etag); err != nil {
			return runtimes.State{}, r.fail(op, in.Name, fmt.Errorf("masking the devices its profiles give it (%s): %w", strings.Join(masks, ", "), err))
		}
		if inst, etag, err = cl.GetInstance(ctx, in.Name); err != nil {
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
	}
	running := inst.Status == incusapi.StatusRunning

	_, _, resize := rootOverride(inst, rootLimit(in))
	if inst.Config[KeyConfigHash] != in.ConfigHash || !devicesEqual(ownDevices(inst.Devices), want) || hardened(inst.Config) != "" || resize {
		old, err := decodeInstance(inst)
		if err != nil {
			// Without the record the image counts as changed: the root is
			// rebuilt rather than trusted.
			old = runtimes.Instance{}
		}
		change := Diff(old, in, inst.Config["raw.idmap"], RawIdmap(id))
		if h := hardened(inst.Config); h != "" {
			// An instance made before the driver hardened instances takes
			// it on its next stop and start.
			change.Restart = append(change.Restart, h)
		}
		if running && change.NeedsRestart() {
			st := stateOf(inst)
			st.RestartRequired = change.String()
			st.Overlay = r.overlay(ctx, cl, inst, old)
			return st, nil
		}
		if change.Image {
			if err := r.rebuild(ctx, cl, in); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
			if inst, etag, err = cl.GetInstance(ctx, in.Name); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
		}
		if err := r.update(ctx, cl, inst, etag, in, want, change.Image); err != nil {
			if re := r.restricted(op, in, project, err); re != nil {
				return runtimes.State{}, re
			}
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
		// The devices of overlays the old configuration had are gone.
		runtimes.UnmountOverlays(old, in)
		if running {
			added, removed := runtimes.DiffGitDirs(old, in)
			if err := bindGitDirs(ctx, cl, in, added, removed); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
		}
		if inst, _, err = cl.GetInstance(ctx, in.Name); err != nil {
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
	}

	if !running {
		if err := cl.SetState(ctx, in.Name, incusapi.InstanceStatePut{Action: "start"}); err != nil {
			if log, lerr := cl.InstanceLog(ctx, in.Name, "lxc.log"); lerr == nil {
				if re := startRefusal(op, in, string(log)); re != nil {
					return runtimes.State{}, re
				}
			}
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
		if inst.Config[KeyAccount] != accountMark(id) {
			if err := setupAccount(ctx, cl, in.Name, id); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
		}
		inst.Status = incusapi.StatusRunning
	}
	// After a start, and after a restart from inside that lost them; those
	// mounted already are left alone.
	if err := bindGitDirs(ctx, cl, in, in.GitDirBinds(), nil); err != nil {
		return runtimes.State{}, r.fail(op, in.Name, err)
	}
	if err := r.limitTCP(ctx, cl, in, inst); err != nil {
		return runtimes.State{}, r.fail(op, in.Name, err)
	}
	st := stateOf(inst)
	st.Overlay = r.overlay(ctx, cl, inst, in)
	return st, nil
}

// bindGitDirs binds and unbinds git directories inside the running
// instance, in the mount namespace of its init (runtimes/mountns).
func bindGitDirs(ctx context.Context, cl *incusapi.Client, in runtimes.Instance, add, remove []runtimes.Bind) error {
	if len(add) == 0 && len(remove) == 0 {
		return nil
	}
	pid, err := initPid(ctx, cl, in.Name)
	if err != nil {
		return fmt.Errorf("binding git directories: %w", err)
	}
	if err := mountns.Eject(uint32(pid), remove); err != nil {
		return err
	}
	var ready []runtimes.Bind
	for _, b := range add {
		err := makeMountPoint(ctx, cl, in.Name, b.Target)
		if errors.Is(err, mountns.ErrLinkInPath) {
			// Left out, as mountns.Inject leaves out a target with a
			// link: the claim's git reports the missing directory.
			continue
		}
		if err != nil {
			return err
		}
		ready = append(ready, b)
	}
	return mountns.Inject(uint32(pid), in, ready)
}

// makeMountPoint creates the missing directories of target inside the
// running instance, as container root, through the file API. The
// controller's own id (host root) is not mapped into the container, so it
// cannot create them itself where the container's own file systems are
// (its /tmp, an idmapped root): the kernel refuses an owner the file system
// cannot represent (EOVERFLOW). Existing directories are left as they are.
// The file API works by path and follows links, so each existing component
// is looked at first, one at a time from the root (the daemon reports a
// link as one), and a link or anything but a directory is refused: the
// agent may have put it there to have container root make directories
// elsewhere in its container. mountns.Inject then opens the target without
// following links, so a link put there after this check is refused too.
func makeMountPoint(ctx context.Context, cl *incusapi.Client, name, target string) error {
	dir := "/"
	missing := false
	for _, part := range strings.Split(strings.Trim(path.Clean(target), "/"), "/") {
		dir = path.Join(dir, part)
		if !missing {
			fi, err := cl.StatFile(ctx, name, dir)
			if err == nil {
				if fi.Type != "directory" {
					return fmt.Errorf("making the mount point %s: %s is a %s: %w", target, dir, fi.Type, mountns.ErrLinkInPath)
				}
				continue
			}
			if !incusapi.IsNotFound(err) {
				return fmt.Errorf("making the mount point %s: %w", target, err)
			}
			missing = true
		}
		if err := cl.MakeDir(ctx, name, dir, 0, 0, 0o755); err != nil {
			return fmt.Errorf("making the mount point %s: %w", target, err)
		}
	}
	return nil
}

func checkOwner(inst *incusapi.Instance, owner string) error {
	switch got := inst.Config[KeyOwner]; got {
	case owner:
		return nil
	case "":
		return fmt.Errorf("an instance of that name exists in project %q and was not made by this controller (no %s key)", inst.Project, KeyOwner)
	default:
		return fmt.Errorf("the instance belongs to Sandbox %s", got)
	}
}

// recorded is the configuration the driver keeps on an instance.
func (r *Runtime) recorded(in runtimes.Instance) (map[string]string, error) {
	desc, err := encodeInstance(in)
	if err != nil {
		return nil, err
	}
	config := map[string]string{
		KeyOwner:      in.Owner,
		KeyConfigHash: in.ConfigHash,
		KeyInstance:   desc,
		"raw.idmap":   RawIdmap(in.Identity),
	}
	maps.Copy(config, Hardening)
	maps.Copy(config, limitsConfig(in.Resources))
	return config, nil
}

// create makes the instance, stopped: Ensure starts it and sets up the
// mapped account.
func (r *Runtime) create(ctx context.Context, cl *incusapi.Client, in runtimes.Instance, devices map[string]incusapi.Device) error {
	src, err := r.resolveImage(ctx, cl, in)
	if err != nil {
		return err
	}
	config, err := r.recorded(in)
	if err != nil {
		return err
	}
	req := incusapi.InstancesPost{Name: in.Name, Source: src, Config: config, Devices: devices}
	if len(in.Incus.Profiles) > 0 {
		req.Profiles = in.Incus.Profiles
	}
	if err := cl.CreateInstance(ctx, req); err != nil {
		if isImageMissing(err) {
			return runtimes.Errorf(runtimes.ReasonImageNotFound, "creating instance", in.Name, "image %q: %w", in.Image, err)
		}
		return err
	}
	return nil
}

// resolveImage checks that a local image exists before creating anything,
// because the daemon's own answer ("Image not provided for instance
// creation") does not say which image is missing.
func (r *Runtime) resolveImage(ctx context.Context, cl *incusapi.Client, in runtimes.Instance) (incusapi.InstanceSource, error) {
	src, remote, err := r.imageSource(in.Image)
	if err != nil {
		return src, runtimes.Errorf(runtimes.ReasonImageNotFound, "resolving the image of", in.Name, "%w", err)
	}
	if remote {
		return src, nil
	}
	_, err = cl.GetImageAlias(ctx, in.Image)
	if err == nil {
		return src, nil
	}
	if !incusapi.IsNotFound(err) {
		return src, err
	}
	img, err := cl.GetImage(ctx, in.Image)
	if err == nil {
		return incusapi.InstanceSource{Type: "image", Fingerprint: img.Fingerprint}, nil
	}
	if !incusapi.IsNotFound(err) {
		return src, err
	}
	project := cl.Project()
	if project == "" {
		project = "default"
	}
	return src, runtimes.Errorf(runtimes.ReasonImageNotFound, "resolving the image of", in.Name,
		"image %q is neither an image alias nor a fingerprint of the Incus server in project %q, and names no remote (as in images:debian/12)", in.Image, project)
}

func isImageMissing(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "image not provided") ||
		strings.Contains(msg, "image not found") ||
		strings.Contains(msg, "couldn't find the requested image") ||
		strings.Contains(msg, "failed getting remote image info")
}

// rebuild makes the root of a stopped instance anew from the new image.
func (r *Runtime) rebuild(ctx context.Context, cl *incusapi.Client, in runtimes.Instance) error {
	src, err := r.resolveImage(ctx, cl, in)
	if err != nil {
		return err
	}
	if err := cl.RebuildInstance(ctx, in.Name, src); err != nil {
		if isImageMissing(err) {
			return runtimes.Errorf(runtimes.ReasonImageNotFound, "rebuilding instance", in.Name, "image %q: %w", in.Image, err)
		}
		return err
	}
	return nil
}

// update writes the recorded description and the driver's devices. On a
// running container Incus mounts added disks, unmounts removed ones and
// remounts changed ones in place.
func (r *Runtime) update(ctx context.Context, cl *incusapi.Client, inst *incusapi.Instance, etag string, in runtimes.Instance, want map[string]incusapi.Device, rebuilt bool) error {
	config, err := r.recorded(in)
	if err != nil {
		return err
	}
	put := inst.Writable()
	merged := map[string]string{}
	for k, v := range put.Config {
		merged[k] = v
	}
	for k, v := range config {
		merged[k] = v
	}
	if rebuilt {
		// The new root has no mapped account yet.
		delete(merged, KeyAccount)
	}
	put.Config = merged
	put.Devices = mergeDevices(put.Devices, want)
	if name, root, ok := rootOverride(inst, rootLimit(in)); ok {
		put.Devices[name] = root
	}
	return cl.UpdateInstance(ctx, in.Name, put, etag)
}

// Stop stops the instance and keeps its root: installed packages and
// container-local files persist. A clean stop that takes longer than
// StopTimeout is followed by a forced one. A missing instance is stopped.
func (r *Runtime) Stop(ctx context.Context, name string) error {
	const op = "stopping instance"
	cl, inst, _, err := r.locate(ctx, name)
	if err != nil {
		return r.fail(op, name, err)
	}
	if inst == nil {
		// Never made (an Ensure that failed before creating it): only
		// the sources held for it may be left.
		return r.release(op, name)
	}
	if inst.Config[KeyOwner] == "" {
		return runtimes.Errorf(runtimes.ReasonNameConflict, op, name, "the instance was not made by this controller (no %s key); leaving it", KeyOwner)
	}
	if inst.Status == incusapi.StatusRunning {
		if err := r.stop(ctx, cl, name); err != nil {
			return r.fail(op, name, err)
		}
	}
	unmountOverlays(inst)
	return r.release(op, name)
}

// unmountOverlays unmounts the merged views of a stopped or deleted
// instance's overlay mounts; their upper layers stay.
func unmountOverlays(inst *incusapi.Instance) {
	if in, err := decodeInstance(inst); err == nil {
		runtimes.UnmountOverlays(in, runtimes.Instance{})
	}
}

func (r *Runtime) stop(ctx context.Context, cl *incusapi.Client, name string) error {
	secs := int(r.cfg.StopTimeout.Seconds())
	if secs < 1 {
		secs = 1
	}
	err := cl.SetState(ctx, name, incusapi.InstanceStatePut{Action: "stop", Timeout: secs})
	if err == nil || incusapi.IsUnavailable(err) || ctx.Err() != nil {
		return err
	}
	inst, _, gerr := cl.GetInstance(ctx, name)
	if gerr == nil && inst.Status != incusapi.StatusRunning {
		return nil
	}
	if ferr := cl.SetState(ctx, name, incusapi.InstanceStatePut{Action: "stop", Force: true}); ferr != nil {
		return errors.Join(err, ferr)
	}
	return nil
}

// Delete removes the instance and its root volume. The agent's areas and
// mounts are host directories bound into it and are never touched.
func (r *Runtime) Delete(ctx context.Context, name string) error {
	const op = "deleting instance"
	cl, inst, _, err := r.locate(ctx, name)
	if err != nil {
		return r.fail(op, name, err)
	}
	if inst == nil {
		// Never made (an Ensure that failed before creating it): only
		// the sources held for it may be left.
		return r.release(op, name)
	}
	if inst.Config[KeyOwner] == "" {
		return runtimes.Errorf(runtimes.ReasonNameConflict, op, name, "the instance was not made by this controller (no %s key); leaving it", KeyOwner)
	}
	if inst.Status == incusapi.StatusRunning {
		if err := cl.SetState(ctx, name, incusapi.InstanceStatePut{Action: "stop", Force: true}); err != nil {
			return r.fail(op, name, err)
		}
	}
	if err := cl.DeleteInstance(ctx, name); err != nil && !incusapi.IsNotFound(err) {
		return r.fail(op, name, err)
	}
	unmountOverlays(inst)
	if err := r.release(op, name); err != nil {
		return err
	}
	r.forget(name)
	return nil
}

// Inspect reports the instance; an absent one is State{Exists: false}.
func (r *Runtime) Inspect(ctx context.Context, name string) (runtimes.State, error) {
	cl, inst, _, err := r.locate(ctx, name)
	if err != nil {
		return runtimes.State{}, r.fail("inspecting instance", name, err)
	}
	if inst == nil {
		return runtimes.State{Name: name}, nil
	}
	st := stateOf(inst)
	if st.Running && st.Owner != "" {
		in, err := decodeInstance(inst)
		if err == nil {
			st.Overlay = r.overlay(ctx, cl, inst, in)
			if gitDirsMissing(ctx, cl, in) {
				// The instance restarted on its own (a reboot inside) and
				// lost the git directories bound after its start: it no
				// longer has the configuration recorded, so the controller
				// ensures it again, which binds them.
				st.ConfigHash = ""
			}
		}
	}
	return st, nil
}

// gitDirsMissing says whether a git directory bind that can be bound is
// not mounted inside the running instance.
func gitDirsMissing(ctx context.Context, cl *incusapi.Client, in runtimes.Instance) bool {
	binds := in.GitDirBinds()
	if len(binds) == 0 {
		return false
	}
	state, err := cl.GetInstanceState(ctx, in.Name)
	if err != nil || state.Pid <= 0 {
		return false
	}
	for _, b := range binds {
		mounted, err := mountns.MountedIn(uint32(state.Pid), b.Target)
		if err != nil || mounted {
			continue
		}
		if dir, err := in.OpenGitDir(b); err == nil {
			dir.Close()
			return true
		}
	}
	return false
}

// Ping reads the server's description, which incusd serves only while it
// runs.
func (r *Runtime) Ping(ctx context.Context) error {
	if _, err := r.client.Server(ctx); err != nil {
		return r.fail("asking incusd at", r.client.Socket(), err)
	}
	return nil
}

// List reports the instances this driver made, in every project.
func (r *Runtime) List(ctx context.Context) ([]runtimes.State, error) {
	list, err := r.client.ListInstances(ctx, true)
	if err != nil {
		return nil, r.fail("listing instances", "", err)
	}
	var out []runtimes.State
	for i := range list {
		if list[i].Config[KeyOwner] == "" {
			continue
		}
		r.remember(list[i].Name, list[i].Project)
		out = append(out, stateOf(&list[i]))
	}
	return out, nil
}

func stateOf(inst *incusapi.Instance) runtimes.State {
	return runtimes.State{
		Name:       inst.Name,
		Exists:     true,
		Running:    inst.Status == incusapi.StatusRunning,
		Owner:      inst.Config[KeyOwner],
		ConfigHash: inst.Config[KeyConfigHash],
		CreatedAt:  inst.CreatedAt,
	}
}

// foreignDevices are the devices an instance's profiles give it beyond its
// root disk: a NIC or proxy device (a way out no egress rule sees), a
// host directory, socket or device the Sandbox never asked for and its
// class never checked, all of them a tenant's by naming a profile. Each is
// masked by an instance device of its name of type none. The instance's
// own devices (the driver's, an administrator's) are not the profiles'.
func foreignDevices(inst *incusapi.Instance) []string {
	var out []string
	for name, d := range inst.ExpandedDevices {
		if _, own := inst.Devices[name]; own || d["type"] == "none" || d["type"] == "disk" && d["path"] == "/" {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// networkDevices are the Incus device types that are a way to a network:
// an instance with an egress allowlist has none.
var networkDevices = []string{"nic", "proxy", "infiniband"}

// OwnNetwork says Incus instances keep their own network namespace
// (runtimes.NetnsReporter).
func (r *Runtime) OwnNetwork() bool { return true }

// NetworkNamespace opens the network namespace of the running instance's
// init (runtimes.NetnsReporter). An instance's namespace belongs to its
// user namespace, so it cannot join one the controller made (mounting
// sysfs inside would fail); the controller serves its egress proxy in
// this one instead. Profiles' NICs are masked (foreignDevices), so
// loopback is all it has. The init is held by a pidfd from before the
// runtime is asked again that it is still the init, to after its
// namespace is open: a pid read once and opened by path later could be
// another process's, of another Sandbox, by then.
func (r *Runtime) NetworkNamespace(ctx context.Context, name string) (*os.File, error) {
	cl, inst, _, err := r.locate(ctx, name)
	if err != nil {
		return nil, r.fail("finding", name, err)
	}
	if inst == nil {
		return nil, runtimes.Errorf(runtimes.ReasonNotFound, "finding", name, "no such instance")
	}
	for dev, d := range inst.ExpandedDevices {
		if slices.Contains(networkDevices, d["type"]) {
			// A way out the proxy does not see: the instance does not
			// run with it.
			err := fmt.Errorf("instance %s has %s device %q (from its profiles): an egress allowlist needs an instance with loopback alone", name, d["type"], dev)
			if serr := r.stop(ctx, cl, name); serr != nil {
				err = errors.Join(err, serr)
			}
			return nil, err
		}
	}
	st, err := cl.GetInstanceState(ctx, name)
	if err != nil {
		return nil, r.fail("reading the state of", name, err)
	}
	if st.Pid <= 0 {
		return nil, fmt.Errorf("instance %s has no init process (status %s), so no network namespace", name, st.Status)
	}
	pidfd, err := unix.PidfdOpen(int(st.Pid), 0)
	if err != nil {
		return nil, fmt.Errorf("instance %s: its init (pid %d) is gone: %w", name, st.Pid, err)
	}
	defer unix.Close(pidfd)
	again, err := cl.GetInstanceState(ctx, name)
	if err != nil {
		return nil, r.fail("reading the state of", name, err)
	}
	if again.Pid != st.Pid || again.Status != incusapi.StatusRunning {
		return nil, fmt.Errorf("instance %s restarted while its network namespace was looked up (init pid %d, then %d, %s)", name, st.Pid, again.Pid, again.Status)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", st.Pid))
	if err != nil {
		return nil, fmt.Errorf("opening the network namespace of instance %s: %w", name, err)
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("instance %s: its init ended while its network namespace was opened: %w", name, err)
	}
	return f, nil
}

// tcpMark is a TCP buffer limit written for one start of an instance.
type tcpMark struct {
	started time.Time
	bytes   int64
}

// limitTCP gives the running instance's cgroup, on cgroup v1, a TCP buffer
// limit equal to its memory limit (none without one): v1 charges a
// cgroup's sockets to nothing until it has one, and Incus sets none, so a
// command could queue on loopback connections (up wherever the egress
// proxy serves the instance) many times its memory limit. The buffers
// get as much again, apart. Written once for each start of the instance
// and each limit: inst, read before a start this pass made, has it
// written again on the next pass.
func (r *Runtime) limitTCP(ctx context.Context, cl *incusapi.Client, in runtimes.Instance, inst *incusapi.Instance) error {
	mark := tcpMark{started: inst.LastUsedAt, bytes: in.Resources.MemoryBytes}
	if mark.bytes <= 0 {
		mark.bytes = -1
	}
	r.mu.Lock()
	done := r.tcp[in.Name] == mark
	r.mu.Unlock()
	if done || cgroup.V2() {
		return nil
	}
	// Where LXC puts the instance's cgroup, or else where its init is: the
	// daemon's state of an instance costs tens of milliseconds.
	if ok, err := cgroup.LimitTCPIn(filepath.Join(cgroup.Mount, "memory", payloadPrefix+lxcName(r.projectOf(in), in.Name)), mark.bytes); err != nil {
		return fmt.Errorf("limiting its TCP buffers: %w", err)
	} else if ok {
		r.limited(in.Name, mark)
		return nil
	}
	pid, err := initPid(ctx, cl, in.Name)
	if err != nil {
		return fmt.Errorf("limiting its TCP buffers: %w", err)
	}
	if err := cgroup.LimitProcessTCP("/proc", pid, payloadCgroup, mark.bytes); err != nil {
		return fmt.Errorf("limiting its TCP buffers: %w", err)
	}
	r.limited(in.Name, mark)
	return nil
}

// limited remembers the TCP buffer limit written for instance name.
func (r *Runtime) limited(name string, mark tcpMark) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tcp == nil {
		r.tcp = map[string]tcpMark{}
	}
	r.tcp[name] = mark
}

// initPid is the pid of the running instance name's init, from the
// daemon's state of it (tens of milliseconds a call).
func initPid(ctx context.Context, cl *incusapi.Client, name string) (int, error) {
	st, err := cl.GetInstanceState(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("finding the init process of instance %s: %w", name, err)
	}
	if st.Pid <= 0 {
		return 0, fmt.Errorf("instance %s has no init process (status %s)", name, st.Status)
	}
	return int(st.Pid), nil
}
