package incus

import (
	"context"
	"fmt"

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
		return &runtimes.Health{Healthy: true, Reason: runtimes.ReasonHealthy,
			Message: fmt.Sprintf("%s is present; its pool driver does not report usage, so rootSizeLimit %d bytes is not checked", where, limit)}
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
