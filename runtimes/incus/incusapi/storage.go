package incusapi

import "context"

// Image is a local image.
type Image struct {
	Fingerprint string `json:"fingerprint"`
	Public      bool   `json:"public"`
}

// ImageAlias names an image.
type ImageAlias struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Type   string `json:"type"`
}

// GetImageAlias reads a local image alias of the client's project.
func (c *Client) GetImageAlias(ctx context.Context, alias string) (ImageAlias, error) {
	var a ImageAlias
	_, err := c.Get(ctx, "/1.0/images/aliases/"+escape(alias), nil, &a)
	return a, err
}

// GetImage reads a local image by fingerprint (a unique prefix is enough).
func (c *Client) GetImage(ctx context.Context, fingerprint string) (Image, error) {
	var im Image
	_, err := c.Get(ctx, "/1.0/images/"+escape(fingerprint), nil, &im)
	return im, err
}

// StoragePool is a storage pool.
type StoragePool struct {
	Name   string            `json:"name"`
	Driver string            `json:"driver"`
	Status string            `json:"status"`
	Config map[string]string `json:"config"`
}

// PoolCreated is the status of a pool that is ready for use.
const PoolCreated = "Created"

// GetStoragePool reads a storage pool.
func (c *Client) GetStoragePool(ctx context.Context, pool string) (StoragePool, error) {
	var p StoragePool
	_, err := c.Get(ctx, "/1.0/storage-pools/"+escape(pool), nil, &p)
	return p, err
}

// VolumeUsage is the space a volume uses, in bytes; Total is -1 or 0
// without a quota.
type VolumeUsage struct {
	Used  uint64 `json:"used"`
	Total int64  `json:"total"`
}

// VolumeState is the state of a storage volume. Usage is nil when the
// pool's driver cannot tell (a dir pool without project quotas).
type VolumeState struct {
	Usage *VolumeUsage `json:"usage"`
}

// StorageVolume is a storage volume.
type StorageVolume struct {
	Name   string            `json:"name"`
	Type   string            `json:"type"`
	Config map[string]string `json:"config"`
}

func volumePath(pool, typ, name string) string {
	return "/1.0/storage-pools/" + escape(pool) + "/volumes/" + escape(typ) + "/" + escape(name)
}

// GetInstanceVolume reads the root volume of a container.
func (c *Client) GetInstanceVolume(ctx context.Context, pool, instance string) (StorageVolume, error) {
	var v StorageVolume
	_, err := c.Get(ctx, volumePath(pool, "container", instance), nil, &v)
	return v, err
}

// GetInstanceVolumeState reads the usage of a container's root volume.
func (c *Client) GetInstanceVolumeState(ctx context.Context, pool, instance string) (VolumeState, error) {
	var s VolumeState
	_, err := c.Get(ctx, volumePath(pool, "container", instance)+"/state", nil, &s)
	return s, err
}
