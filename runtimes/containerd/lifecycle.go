package containerd

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/runtimes/mountns"
)

// Ensure creates the container if it is absent and starts its task if it is
// not running. A running container converged to another configuration takes
// what it can live (allowlist, passthrough names, limits) and otherwise
// reports RestartRequired; a stopped one is brought to the new
// configuration before it starts, keeping its writable root unless the
// image changed.
func (r *Runtime) Ensure(ctx context.Context, in runtimes.Instance) (runtimes.State, error) {
	const op = "ensuring container"
	if in.Containerd == nil || in.Image == "" {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "the instance has no containerd image")
	}
	user, err := agentUser(in)
	if err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonRefused, op, in.Name, "%w", err)
	}
	// Say which mount source a bind cannot use before the runtime fails
	// on it in its own words.
	if err := runtimes.CheckMountSources(in); err != nil {
		return runtimes.State{}, err
	}
	if err := in.LayoutAreas(); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "%w", err)
	}
	// The merged views of overlay mounts exist before a task binds them.
	if err := runtimes.MountOverlays(nil, in); err != nil {
		return runtimes.State{}, err
	}
	ctx, c, err := r.connect(ctx, op, in.Name)
	if err != nil {
		return runtimes.State{}, err
	}
	cont, err := c.LoadContainer(ctx, in.Name)
	created := false
	if errdefs.IsNotFound(err) {
		cont, err = r.create(ctx, c, in, user)
		created = true
	}
	if err != nil {
		return runtimes.State{}, r.fail(op, in.Name, err)
	}
	info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return runtimes.State{}, r.fail(op, in.Name, err)
	}
	if err := checkOwner(info, in.Owner); err != nil {
		return runtimes.State{}, runtimes.Errorf(runtimes.ReasonNameConflict, op, in.Name, "%w", err)
	}
	task, running, err := taskOf(ctx, cont)
	if err != nil {
		return runtimes.State{}, r.fail(op, in.Name, err)
	}

	if info.Labels[HashLabel] != in.ConfigHash {
		old, err := decodeInstance(info)
		if err != nil {
			// Without the record every part that needs a restart counts
			// as changed; the image name is on the container itself.
			old = runtimes.Instance{Image: info.Image}
		}
		change := Diff(old, in)
		if running && change.NeedsRestart() {
			st := stateOf(info, true)
			st.RestartRequired = change.String()
			st.Overlay, err = r.overlay(ctx, c, info, task, true, old)
			if err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
			return st, nil
		}
		if change.Image {
			// The old root goes with the old container: only once the new
			// image is known to be there.
			if _, err := c.GetImage(ctx, in.Image); err != nil {
				if errdefs.IsNotFound(err) {
					return runtimes.State{}, r.imageNotFound(op, in)
				}
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
			if err := r.remove(ctx, cont, task); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
			task, created = nil, true
			if cont, err = r.create(ctx, c, in, user); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
		} else {
			if running {
				if err := liveBinds(task, in, change); err != nil {
					return runtimes.State{}, r.fail(op, in.Name, err)
				}
			}
			if err := r.update(ctx, c, cont, in, user); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
			if !running {
				// No task binds the overlays the old configuration had.
				runtimes.UnmountOverlays(old, in)
			}
		}
		if running && change.Limits {
			if err := task.Update(ctx, containerd.WithResources(liveResources(in, r.swap))); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, fmt.Errorf("applying new limits to the running task: %w", err))
			}
			if err := r.limitTCP(task, in); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
		}
		if info, err = cont.Info(ctx); err != nil {
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
	}

	if !running {
		// The areas come from a tree built now, for this configuration,
		// with every mount at its destination (trees.go).
		if err := r.buildTree(in); err != nil {
			return runtimes.State{}, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "%w", err)
		}
		// A container made by an earlier version of the driver may carry
		// a spec that binds the custom mounts by their paths inside the
		// workspace: every start runs the spec this driver makes.
		if !created {
			if err := r.update(ctx, c, cont, in, user); err != nil {
				return runtimes.State{}, r.fail(op, in.Name, err)
			}
		}
		if task, err = r.start(ctx, c, cont, task, in, !created); err != nil {
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
		if err := mountns.Inject(task.Pid(), in, in.GitDirBinds()); err != nil {
			return runtimes.State{}, r.fail(op, in.Name, err)
		}
	}
	st := stateOf(info, true)
	if st.Overlay, err = r.overlay(ctx, c, info, task, true, in); err != nil {
		return runtimes.State{}, r.fail(op, in.Name, err)
	}
	return st, nil
}

// liveBinds applies the git directory binds a change adds and removes to
// the running task, before the record says they are there.
func liveBinds(task containerd.Task, in runtimes.Instance, change Change) error {
	if len(change.BindsAdded) == 0 && len(change.BindsRemoved) == 0 {
		return nil
	}
	pid := task.Pid()
	if err := mountns.Eject(pid, change.BindsRemoved); err != nil {
		return err
	}
	return mountns.Inject(pid, in, change.BindsAdded)
}

func checkOwner(info containers.Container, owner string) error {
	switch got := info.Labels[OwnerLabel]; got {
	case owner:
		return nil
	case "":
		return fmt.Errorf("a container of that name exists and was not made by this controller (no %s label)", OwnerLabel)
	default:
		return fmt.Errorf("the container belongs to Sandbox %s", got)
	}
}

// create makes the container from an image already in the namespace.
func (r *Runtime) create(ctx context.Context, c *containerd.Client, in runtimes.Instance, user specs.User) (containerd.Container, error) {
	const op = "creating container"
	img, err := c.GetImage(ctx, in.Image)
	if errdefs.IsNotFound(err) {
		return nil, r.imageNotFound(op, in)
	}
	if err != nil {
		return nil, r.fail(op, in.Name, fmt.Errorf("looking up image %q: %w", in.Image, err))
	}
	// Unpacking is local: the layers are already in the content store.
	if ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter); err != nil || !ok {
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, r.fail(op, in.Name, fmt.Errorf("unpacking image %q into snapshotter %s: %w", in.Image, r.cfg.Snapshotter, err))
		}
	}
	ext, err := encodeInstance(in)
	if err != nil {
		return nil, runtimes.Errorf(runtimes.ReasonFailed, op, in.Name, "%w", err)
	}
	// A snapshot left by a create that failed halfway is the container's
	// writable root: reuse it rather than lose what is in it.
	snapshot := containerd.WithNewSnapshot(in.Name, img)
	if _, err := c.SnapshotService(r.cfg.Snapshotter).Stat(ctx, in.Name); err == nil {
		snapshot = containerd.WithSnapshot(in.Name)
	}
	cont, err := c.NewContainer(ctx, in.Name,
		containerd.WithImage(img),
		containerd.WithSnapshotter(r.cfg.Snapshotter),
		snapshot,
		containerd.WithRuntime(r.cfg.Runtime, nil),
		containerd.WithNewSpec(r.specOpts(in, user)...),
		containerd.WithContainerLabels(labels(in)),
		containerd.WithContainerExtension(instanceExtension, ext),
	)
	if errdefs.IsAlreadyExists(err) {
		// Another reconcile won the race; its container is the one.
		return c.LoadContainer(ctx, in.Name)
	}
	if err != nil {
		return nil, r.fail(op, in.Name, err)
	}
	return cont, nil
}

func (r *Runtime) imageNotFound(op string, in runtimes.Instance) error {
	return runtimes.Errorf(runtimes.ReasonImageNotFound, op, in.Name,
		"image %q not found in namespace %q (images are never pulled: import it into that namespace)", in.Image, r.cfg.Namespace)
}

// update brings a container's spec, labels and record to in, keeping its
// snapshot (and so its container-local state).
func (r *Runtime) update(ctx context.Context, c *containerd.Client, cont containerd.Container, in runtimes.Instance, user specs.User) error {
	spec, err := oci.GenerateSpec(ctx, c, &containers.Container{ID: in.Name}, r.specOpts(in, user)...)
	if err != nil {
		return fmt.Errorf("generating the new spec: %w", err)
	}
	ext, err := encodeInstance(in)
	if err != nil {
		return err
	}
	return cont.Update(ctx, func(_ context.Context, _ *containerd.Client, rec *containers.Container) error {
		s, err := typeurl.MarshalAny(spec)
		if err != nil {
			return fmt.Errorf("encoding the new spec: %w", err)
		}
		rec.Spec = s
		if rec.Labels == nil {
			rec.Labels = map[string]string{}
		}
		for k, v := range labels(in) {
			rec.Labels[k] = v
		}
		if rec.Extensions == nil {
			rec.Extensions = map[string]typeurl.Any{}
		}
		rec.Extensions[instanceExtension] = ext
		return nil
	})
}

// start replaces a task that is not running with a new one and starts it.
// The init's stdio goes nowhere, so the task does not depend on this
// process staying alive.
// A container made just now has its snapshot: checkSnapshot is false then.
func (r *Runtime) start(ctx context.Context, c *containerd.Client, cont containerd.Container, stale containerd.Task, in runtimes.Instance, checkSnapshot bool) (containerd.Task, error) {
	if stale != nil {
		if _, err := stale.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("deleting the stopped task: %w", err)
		}
	}
	if checkSnapshot {
		if err := r.restoreSnapshot(ctx, c, cont, in); err != nil {
			return nil, err
		}
	}
	rootfs, err := r.rootfsOpts(ctx, c, cont, in)
	if err != nil {
		return nil, err
	}
	task, err := cont.NewTask(ctx, cio.NullIO, rootfs...)
	if err != nil {
		return nil, fmt.Errorf("creating the task: %w", err)
	}
	// Before its init runs, so every process of the container is bounded.
	if err := r.limitTCP(task, in); err != nil {
		_, _ = task.Delete(ctx, containerd.WithProcessKill)
		return nil, err
	}
	// Wait before Start, so an init that exits at once is seen here rather
	// than left behind as a stopped task.
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited, err := task.Wait(waitCtx)
	if err != nil {
		_, _ = task.Delete(ctx, containerd.WithProcessKill)
		return nil, fmt.Errorf("waiting on the task: %w", err)
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(ctx, containerd.WithProcessKill)
		return nil, fmt.Errorf("starting init %v: %w", r.cfg.Init, err)
	}
	select {
	case s := <-exited:
		_, _ = task.Delete(ctx)
		return nil, fmt.Errorf("init %v exited at once with status %d", r.cfg.Init, s.ExitCode())
	default:
	}
	return task, nil
}

// restoreSnapshot gives a container whose snapshot is gone a fresh one from
// its image: its container-local state is lost already, and without a root
// it could never start again.
func (r *Runtime) restoreSnapshot(ctx context.Context, c *containerd.Client, cont containerd.Container, in runtimes.Instance) error {
	info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return err
	}
	_, err = c.SnapshotService(info.Snapshotter).Stat(ctx, info.SnapshotKey)
	if !errdefs.IsNotFound(err) {
		return err
	}
	img, err := c.GetImage(ctx, in.Image)
	if errdefs.IsNotFound(err) {
		return r.imageNotFound("restoring the snapshot of", in)
	}
	if err != nil {
		return err
	}
	return cont.Update(ctx, containerd.UpdateContainerOpts(containerd.WithNewSnapshot(info.SnapshotKey, img)))
}

// Stop kills the task, waits for it to exit and deletes it, then removes
// its mount trees. The container and its snapshot stay, so the next start
// finds its root as it was.
func (r *Runtime) Stop(ctx context.Context, name string) error {
	const op = "stopping container"
	ctx, c, err := r.connect(ctx, op, name)
	if err != nil {
		return err
	}
	cont, err := c.LoadContainer(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return r.fail(op, name, err)
	}
	task, _, err := taskOf(ctx, cont)
	if err != nil {
		return r.fail(op, name, err)
	}
	if task != nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return r.fail(op, name, err)
		}
	}
	// The trees go before the overlays: a tree holds a clone of each
	// merged view, and the next start mounts the overlay afresh.
	if err := r.removeTrees(name); err != nil {
		return r.fail(op, name, err)
	}
	if info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata); err == nil {
		unmountOverlays(info)
	}
	return nil
}

// unmountOverlays unmounts the merged views of the overlay mounts a
// container's record names, once no task binds them; their upper layers
// stay.
func unmountOverlays(info containers.Container) {
	if in, err := decodeInstance(info); err == nil {
		runtimes.UnmountOverlays(in, runtimes.Instance{})
	}
}

// Delete removes the task, the container, its snapshot and its mount
// trees. It refuses a container the controller did not make; the host
// areas are never touched.
func (r *Runtime) Delete(ctx context.Context, name string) error {
	const op = "deleting container"
	ctx, c, err := r.connect(ctx, op, name)
	if err != nil {
		return err
	}
	cont, err := c.LoadContainer(ctx, name)
	if errdefs.IsNotFound(err) {
		// Trees a start left before its container went are ours alone.
		if err := r.removeTrees(name); err != nil {
			return r.fail(op, name, err)
		}
		return nil
	}
	if err != nil {
		return r.fail(op, name, err)
	}
	info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return r.fail(op, name, err)
	}
	if info.Labels[OwnerLabel] == "" {
		return runtimes.Errorf(runtimes.ReasonNameConflict, op, name, "the container was not made by this controller (no %s label); leaving it", OwnerLabel)
	}
	task, _, err := taskOf(ctx, cont)
	if err != nil {
		return r.fail(op, name, err)
	}
	if err := r.remove(ctx, cont, task); err != nil {
		return r.fail(op, name, err)
	}
	if err := r.removeTrees(name); err != nil {
		return r.fail(op, name, err)
	}
	unmountOverlays(info)
	return nil
}

// remove deletes the task, if any, then the container with its snapshot.
func (r *Runtime) remove(ctx context.Context, cont containerd.Container, task containerd.Task) error {
	if task != nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("deleting the task: %w", err)
		}
	}
	info, infoErr := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err := cont.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("deleting the container and its snapshot: %w", err)
	}
	if infoErr == nil {
		if in, err := decodeInstance(info); err == nil {
			if err := removeRootfs(in); err != nil {
				return fmt.Errorf("removing the container's writable layer: %w", err)
			}
		}
	}
	return nil
}

// Inspect reports the container: whether its task runs, the configuration
// and owner it carries, and the health of its writable root.
func (r *Runtime) Inspect(ctx context.Context, name string) (runtimes.State, error) {
	const op = "inspecting container"
	ctx, c, err := r.connect(ctx, op, name)
	if err != nil {
		return runtimes.State{}, err
	}
	cont, err := c.LoadContainer(ctx, name)
	if errdefs.IsNotFound(err) {
		return runtimes.State{Name: name}, nil
	}
	if err != nil {
		return runtimes.State{}, r.fail(op, name, err)
	}
	info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return runtimes.State{}, r.fail(op, name, err)
	}
	task, running, err := taskOf(ctx, cont)
	if err != nil {
		return runtimes.State{}, r.fail(op, name, err)
	}
	st := stateOf(info, running)
	// Without a readable record there is no size limit to check against.
	in, _ := decodeInstance(info)
	if st.Overlay, err = r.overlay(ctx, c, info, task, running, in); err != nil {
		return runtimes.State{}, r.fail(op, name, err)
	}
	return st, nil
}

// Ping asks the daemon its version: the cheapest call that answers only
// when containerd does.
func (r *Runtime) Ping(ctx context.Context) error {
	const op = "asking the version of containerd at"
	ctx, c, err := r.connect(ctx, op, r.cfg.Address)
	if err != nil {
		return err
	}
	if _, err := c.Version(ctx); err != nil {
		return r.fail(op, r.cfg.Address, err)
	}
	return nil
}

// List reports every container in the namespace that carries the owner label.
func (r *Runtime) List(ctx context.Context) ([]runtimes.State, error) {
	const op = "listing containers in namespace"
	ctx, c, err := r.connect(ctx, op, r.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	conts, err := c.Containers(ctx, fmt.Sprintf("labels.%q", OwnerLabel))
	if err != nil {
		return nil, r.fail(op, r.cfg.Namespace, err)
	}
	out := make([]runtimes.State, 0, len(conts))
	for _, cont := range conts {
		info, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
		if err != nil {
			return nil, r.fail(op, r.cfg.Namespace, err)
		}
		_, running, err := taskOf(ctx, cont)
		if err != nil {
			return nil, r.fail(op, r.cfg.Namespace, err)
		}
		out = append(out, stateOf(info, running))
	}
	return out, nil
}

func stateOf(info containers.Container, running bool) runtimes.State {
	return runtimes.State{
		Name:       info.ID,
		Exists:     true,
		Running:    running,
		Owner:      info.Labels[OwnerLabel],
		ConfigHash: info.Labels[HashLabel],
		CreatedAt:  info.CreatedAt,
	}
}

// taskOf returns the container's task, nil when it has none, and whether it
// is running.
func taskOf(ctx context.Context, cont containerd.Container) (containerd.Task, bool, error) {
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	s, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return task, s.Status == containerd.Running, nil
}

// limitTCP gives the task's memory cgroup on cgroup v1 a TCP buffer limit
// equal to its memory limit (none without one): v1 charges a cgroup's
// sockets to nothing until it has one, so a command could queue a
// gigabyte on loopback connections under a 128 MiB limit. runc ignores
// the OCI spec's kernelTCP, so the driver writes it, as the bwrap driver
// does for its cgroups; the buffers are counted apart from the memory
// limit and get as much again.
func (r *Runtime) limitTCP(task containerd.Task, in runtimes.Instance) error {
	l := memoryLimit(in)
	if l <= 0 {
		l = -1
	}
	if err := cgroup.LimitProcessTCP(r.cfg.ProcDir, int(task.Pid()), nil, l); err != nil {
		return fmt.Errorf("limiting the task's TCP buffers: %w", err)
	}
	return nil
}
