package incus

import (
	"context"
	"fmt"
	"strconv"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
)

// overlay reports OverlayHealthy: the root volume (rootHealth), then the
// overlay mounts.
func (r *Runtime) overlay(ctx context.Context, cl *incusapi.Client, inst *incusapi.Instance, in runtimes.Instance) *runtimes.Health {
	return runtimes.CombineHealth(r.rootHealth(ctx, cl, inst, in), runtimes.OverlayMountsHealth(in, inst.Status == incusapi.StatusRunning))
}

// rootHealth reports the health of the instance's root volume: its storage
// pool is there and created, the volume exists, and its usage is within
// spec.incus.rootSizeLimit when one is set and the pool's driver reports
// usage. A failure to ask is itself reported, never returned: health is a
// condition, not a reason to stop reconciling.
func (r *Runtime) rootHealth(ctx context.Context, cl *incusapi.Client, inst *incusapi.Instance, in runtimes.Instance) *runtimes.Health {
	pool := rootPool(inst)
	if pool == "" {
		return &runtimes.Health{Reason: runtimes.ReasonNotMounted, Message: fmt.Sprintf("instance %s has no root disk device with a storage pool", inst.Name)}
	}
	p, err := cl.GetStoragePool(ctx, pool)
	if err != nil {
		return &runtimes.Health{Reason: runtimes.ReasonNotMounted, Message: fmt.Sprintf("storage pool %q of instance %s: %v", pool, inst.Name, err)}
	}
	if p.Status != incusapi.PoolCreated {
		return &runtimes.Health{Reason: runtimes.ReasonNotMounted, Message: fmt.Sprintf("storage pool %q of instance %s is %s, not %s", pool, inst.Name, p.Status, incusapi.PoolCreated)}
	}
	if _, err := cl.GetInstanceVolume(ctx, pool, inst.Name); err != nil {
		if incusapi.IsNotFound(err) {
			return &runtimes.Health{Reason: runtimes.ReasonSnapshotMissing, Message: fmt.Sprintf("the root volume of instance %s is missing from storage pool %q", inst.Name, pool)}
		}
		return &runtimes.Health{Reason: runtimes.ReasonNotMounted, Message: fmt.Sprintf("root volume of instance %s in storage pool %q: %v", inst.Name, pool, err)}
	}
	return usageHealth(inst.Name, p, rootLimit(in), func() (incusapi.VolumeState, error) {
		return cl.GetInstanceVolumeState(ctx, pool, inst.Name)
	})
}

func usageHealth(name string, p incusapi.StoragePool, limit int64, state func() (incusapi.VolumeState, error)) *runtimes.Health {
	where := fmt.Sprintf("the root volume of instance %s in storage pool %q (%s)", name, p.Name, p.Driver)
	if limit <= 0 {
		return &runtimes.Health{Healthy: true, Reason: runtimes.ReasonHealthy, Message: where + " is present; no rootSizeLimit is set"}
	}
	st, err := state()
	if err != nil {
		return &runtimes.Health{Reason: runtimes.ReasonNotMounted, Message: fmt.Sprintf("reading the usage of %s: %v", where, err)}
	}
	if st.Usage == nil {
		// Incus enforces a root disk's size through the pool's quotas,
		// and reports usage where it has them; without, it ignores the
		// size: a dir pool on a file system without project quotas.
		return &runtimes.Health{Reason: runtimes.ReasonSizeLimitNotEnforced,
			Message: fmt.Sprintf("%s cannot hold the instance to its rootSizeLimit of %d bytes: the pool has no quotas (a dir pool needs project quotas on its file system; btrfs, zfs and lvm pools have them)", where, limit)}
	}
	if int64(st.Usage.Used) > limit {
		return &runtimes.Health{Reason: runtimes.ReasonUpperDirOverLimit,
			Message: fmt.Sprintf("%s uses %d bytes, over its rootSizeLimit of %d bytes", where, st.Usage.Used, limit)}
	}
	return &runtimes.Health{Healthy: true, Reason: runtimes.ReasonHealthy,
		Message: fmt.Sprintf("%s uses %d of its %d bytes (rootSizeLimit)", where, st.Usage.Used, limit)}
}

// rootPool is the storage pool of the instance's root disk.
func rootPool(inst *incusapi.Instance) string {
	for _, devs := range []map[string]incusapi.Device{inst.ExpandedDevices, inst.Devices} {
		for _, d := range devs {
			if d["type"] == "disk" && d["path"] == "/" && d["pool"] != "" {
				return d["pool"]
			}
		}
	}
	return ""
}

func rootLimit(in runtimes.Instance) int64 {
	if in.Incus == nil {
		return 0
	}
	return in.Incus.RootSizeLimit.BytesOf()
}

// rootOverride is the instance's root disk device with its size set to
// limit (the profile's device, overridden on the instance), when the
// instance does not have that size yet: the pool holds the root to it
// where it has quotas. A limit of zero asks for nothing.
func rootOverride(inst *incusapi.Instance, limit int64) (string, incusapi.Device, bool) {
	if limit <= 0 {
		return "", nil, false
	}
	for name, d := range inst.ExpandedDevices {
		if d["type"] != "disk" || d["path"] != "/" || d["pool"] == "" {
			continue
		}
		size := strconv.FormatInt(limit, 10)
		if inst.Devices[name]["size"] == size {
			return "", nil, false
		}
		root := incusapi.Device{}
		for k, v := range d {
			root[k] = v
		}
		root["size"] = size
		return name, root, true
	}
	return "", nil, false
}
