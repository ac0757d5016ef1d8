package runtimes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// The ConfigHash is what the drivers record on a running instance and the
// Sandbox reconciler compares: a different hash restarts the instance. Its
// input is written out here, field by field, apart from the shapes of
// Instance and the types it carries, so that those can change (a field
// renamed, moved or dropped) without a restart of every running sandbox.
// Version 1 is the encoding an Instance had when the hash was first
// recorded; it never changes. A change that must restart instances makes a
// version 2 beside it (hashed with a prefix), never an edit of version 1.
// bridge/instance's encoding test holds version 1 to its recorded form. A
// field no recorded instance had may join it when it is left out of the
// encoding while unset (omitempty): every recorded hash stays as it was.

// configV1 is the input of ConfigHash version 1.
type configV1 struct {
	Name        string        `json:"name"`
	Agent       string        `json:"agent"`
	Owner       string        `json:"owner"` // always empty: adopting an instance is no change
	AgentDir    string        `json:"agentDir"`
	Areas       []bindV1      `json:"areas"`
	Mounts      []bindV1      `json:"mounts"`
	Binaries    []string      `json:"binaries"`
	Devices     devicesV1     `json:"devices"`
	Passthrough []string      `json:"passthrough"`
	Image       string        `json:"image,omitempty"`
	ImageRoot   string        `json:"imageRoot,omitempty"`
	Containerd  *containerdV1 `json:"containerd,omitempty"`
	Incus       *incusV1      `json:"incus,omitempty"`
	Identity    identityV1    `json:"identity"`
	StopOnExit  bool          `json:"stopOnExit"`
	Resources   resourcesV1   `json:"resources"`
	Network     *networkV1    `json:"network,omitempty"`
	Pod         *podV1        `json:"pod,omitempty"`
}

type podV1 struct {
	UID    string `json:"uid"`
	Cgroup string `json:"cgroup"`
}

type networkV1 struct {
	Namespace string `json:"namespace"`
	Proxy     string `json:"proxy,omitempty"`
}

type bindV1 struct {
	Source   string    `json:"source"`
	Target   string    `json:"target"`
	ReadOnly bool      `json:"readOnly"`
	Overlay  *layersV1 `json:"overlay,omitempty"`
	GitDir   bool      `json:"gitDir,omitempty"`
	Anchor   string    `json:"anchor,omitempty"`
	NoLinks  bool      `json:"noLinks,omitempty"`
}

type layersV1 struct {
	Lower        string `json:"lower"`
	Upper        string `json:"upper"`
	Work         string `json:"work"`
	Merged       string `json:"merged"`
	SizeLimit    int64  `json:"sizeLimit,omitempty"`
	Owner        uint32 `json:"owner,omitempty"`
	LowerAnchor  string `json:"lowerAnchor,omitempty"`
	LowerNoLinks bool   `json:"lowerNoLinks,omitempty"`
	Disk         string `json:"disk,omitempty"`
}

type devicesV1 struct {
	USB bool `json:"usb,omitempty"`
	All bool `json:"all,omitempty"`
}

type containerdV1 struct {
	Image           string  `json:"image"`
	MemoryLimit     *string `json:"memoryLimit,omitempty"`
	PidsLimit       int64   `json:"pidsLimit,omitempty"`
	RootfsSizeLimit *string `json:"rootfsSizeLimit,omitempty"`
}

type incusV1 struct {
	Image          string   `json:"image"`
	Profiles       []string `json:"profiles,omitempty"`
	Project        string   `json:"project,omitempty"`
	ShutdownOnExit *bool    `json:"shutdownOnExit,omitempty"`
	RootSizeLimit  *string  `json:"rootSizeLimit,omitempty"`
}

type identityV1 struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type resourcesV1 struct {
	CPUMillis          int64 `json:"cpuMillis,omitempty"`
	MemoryBytes        int64 `json:"memoryBytes,omitempty"`
	Pids               int64 `json:"pids,omitempty"`
	CPURequestMillis   int64 `json:"cpuRequestMillis,omitempty"`
	MemoryRequestBytes int64 `json:"memoryRequestBytes,omitempty"`
}

// configInputV1 is in as ConfigHash version 1 reads it.
func (in Instance) configInputV1() configV1 {
	c := configV1{
		Name: in.Name, Agent: in.Agent, AgentDir: in.AgentDir,
		Areas: bindsV1(in.Areas), Mounts: bindsV1(in.Mounts),
		Binaries: in.Binaries, Devices: devicesV1{USB: in.Devices.USB, All: in.Devices.All},
		Passthrough: in.Env, Image: in.Image, ImageRoot: in.ImageContainer,
		Identity:   identityV1{UID: in.Identity.UID, GID: in.Identity.GID},
		StopOnExit: in.StopOnExit,
		Resources: resourcesV1{CPUMillis: in.Resources.CPUMillis, MemoryBytes: in.Resources.MemoryBytes, Pids: in.Resources.Pids,
			CPURequestMillis: in.Resources.CPURequestMillis, MemoryRequestBytes: in.Resources.MemoryRequestBytes},
	}
	if x := in.Containerd; x != nil {
		c.Containerd = &containerdV1{Image: in.Image, MemoryLimit: sizeV1(x.MemoryLimit), PidsLimit: x.PidsLimit, RootfsSizeLimit: sizeV1(x.RootfsSizeLimit)}
	}
	if x := in.Network; x != nil {
		c.Network = &networkV1{Namespace: x.Namespace, Proxy: x.Proxy}
	}
	if x := in.Pod; x != nil {
		c.Pod = &podV1{UID: x.UID, Cgroup: x.Cgroup}
	}
	if x := in.Incus; x != nil {
		c.Incus = &incusV1{Image: in.Image, Profiles: x.Profiles, Project: x.Project, ShutdownOnExit: x.ShutdownOnExit, RootSizeLimit: sizeV1(x.RootSizeLimit)}
	}
	return c
}

func bindsV1(binds []Bind) []bindV1 {
	if binds == nil {
		return nil
	}
	out := make([]bindV1, 0, len(binds))
	for _, b := range binds {
		v := bindV1{Source: b.Source, Target: b.Target, ReadOnly: b.ReadOnly, GitDir: b.GitDir, Anchor: b.Anchor, NoLinks: b.NoLinks}
		if l := b.Overlay; l != nil {
			v.Overlay = &layersV1{Lower: l.Lower, Upper: l.Upper, Work: l.Work, Merged: l.Merged, SizeLimit: l.SizeLimit,
				Owner: l.Owner, LowerAnchor: l.LowerAnchor, LowerNoLinks: l.LowerNoLinks, Disk: l.Disk}
		}
		out = append(out, v)
	}
	return out
}

// sizeV1 is a size as the quantity it was written as.
func sizeV1(s *Size) *string {
	if s == nil {
		return nil
	}
	return &s.Text
}

// Hash identifies the configuration of in (ConfigHash version 1): every
// field but its owner and its ConfigHash; the describer sets ConfigHash to
// it.
func (in Instance) Hash() string {
	b, err := json.Marshal(in.configInputV1())
	if err != nil {
		panic(fmt.Sprintf("marshalling the configuration of instance %s: %v", in.Name, err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}
