package incusapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Device is one device of an instance: its type and options, all strings.
type Device map[string]string

// Instance is an instance as the daemon describes it.
type Instance struct {
	Name            string            `json:"name"`
	Project         string            `json:"project"`
	Type            string            `json:"type"`
	Status          string            `json:"status"`
	StatusCode      int               `json:"status_code"`
	Profiles        []string          `json:"profiles"`
	Config          map[string]string `json:"config"`
	Devices         map[string]Device `json:"devices"`
	ExpandedConfig  map[string]string `json:"expanded_config"`
	ExpandedDevices map[string]Device `json:"expanded_devices"`
	Ephemeral       bool              `json:"ephemeral"`
	Stateful        bool              `json:"stateful"`
	Description     string            `json:"description"`
	Architecture    string            `json:"architecture"`
	CreatedAt       time.Time         `json:"created_at"`
	// LastUsedAt is when the instance last started.
	LastUsedAt time.Time `json:"last_used_at"`
}

// Instance statuses the driver acts on.
const (
	StatusRunning = "Running"
	StatusStopped = "Stopped"
)

// InstancePut is the writable part of an instance, for PUT.
type InstancePut struct {
	Architecture string            `json:"architecture,omitempty"`
	Config       map[string]string `json:"config"`
	Devices      map[string]Device `json:"devices"`
	Ephemeral    bool              `json:"ephemeral"`
	Profiles     []string          `json:"profiles"`
	Stateful     bool              `json:"stateful"`
	Description  string            `json:"description"`
}

// Writable is the part of i a PUT takes.
func (i *Instance) Writable() InstancePut {
	return InstancePut{
		Architecture: i.Architecture,
		Config:       i.Config,
		Devices:      i.Devices,
		Ephemeral:    i.Ephemeral,
		Profiles:     i.Profiles,
		Stateful:     i.Stateful,
		Description:  i.Description,
	}
}

// InstanceSource says what a new instance is made from.
type InstanceSource struct {
	// Type is "image" (or "none" for an empty root).
	Type string `json:"type"`
	// Alias or Fingerprint names the image; Server and Protocol name a
	// remote image server ("simplestreams" or "incus").
	Alias       string `json:"alias,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Server      string `json:"server,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	Mode        string `json:"mode,omitempty"`
}

// InstancesPost creates an instance.
type InstancesPost struct {
	Name     string            `json:"name"`
	Type     string            `json:"type,omitempty"`
	Source   InstanceSource    `json:"source"`
	Config   map[string]string `json:"config,omitempty"`
	Devices  map[string]Device `json:"devices,omitempty"`
	Profiles []string          `json:"profiles,omitempty"`
	Start    bool              `json:"start"`
}

// InstanceStatePut changes whether an instance runs.
type InstanceStatePut struct {
	Action string `json:"action"`
	// Timeout is how long a clean stop may take, in seconds; -1 waits forever.
	Timeout int  `json:"timeout"`
	Force   bool `json:"force"`
}

func instancePath(name string) string { return "/1.0/instances/" + escape(name) }

// GetInstance reads an instance and its ETag.
func (c *Client) GetInstance(ctx context.Context, name string) (*Instance, string, error) {
	var in Instance
	res, err := c.Get(ctx, instancePath(name), nil, &in)
	if err != nil {
		return nil, "", err
	}
	return &in, res.ETag, nil
}

// InstanceState is the running state of an instance.
type InstanceState struct {
	Status string `json:"status"`
	// Pid is the host process ID of the container's init, 0 when stopped.
	Pid int64 `json:"pid"`
}

// GetInstanceState reads an instance's running state.
func (c *Client) GetInstanceState(ctx context.Context, name string) (InstanceState, error) {
	var st InstanceState
	_, err := c.Get(ctx, instancePath(name)+"/state", nil, &st)
	return st, err
}

// ListInstances lists the instances of the client's project, or of every
// project with allProjects.
func (c *Client) ListInstances(ctx context.Context, allProjects bool) ([]Instance, error) {
	q := url.Values{"recursion": {"1"}}
	cl := c
	if allProjects {
		q.Set("all-projects", "true")
		cl = c.InProject("")
	}
	var out []Instance
	if _, err := cl.Get(ctx, "/1.0/instances", q, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CreateInstance creates an instance and waits until it exists.
func (c *Client) CreateInstance(ctx context.Context, req InstancesPost) error {
	if req.Type == "" {
		req.Type = "container"
	}
	_, err := c.Run(ctx, http.MethodPost, "/1.0/instances", nil, req, "")
	if err != nil {
		return fmt.Errorf("creating instance %s: %w", req.Name, err)
	}
	return nil
}

// UpdateInstance replaces the writable part of an instance. With etag, it
// fails with 412 when the instance changed since it was read.
func (c *Client) UpdateInstance(ctx context.Context, name string, put InstancePut, etag string) error {
	_, err := c.Run(ctx, http.MethodPut, instancePath(name), nil, put, etag)
	if err != nil {
		return fmt.Errorf("updating instance %s: %w", name, err)
	}
	return nil
}

// SetState starts, stops or restarts an instance and waits for it.
func (c *Client) SetState(ctx context.Context, name string, put InstanceStatePut) error {
	_, err := c.Run(ctx, http.MethodPut, instancePath(name)+"/state", nil, put, "")
	if err != nil {
		return fmt.Errorf("%s instance %s: %w", verb(put.Action), name, err)
	}
	return nil
}

func verb(action string) string {
	switch action {
	case "start":
		return "starting"
	case "stop":
		return "stopping"
	case "restart":
		return "restarting"
	}
	return action
}

// DeleteInstance deletes a stopped instance and its root volume.
func (c *Client) DeleteInstance(ctx context.Context, name string) error {
	_, err := c.Run(ctx, http.MethodDelete, instancePath(name), nil, nil, "")
	if err != nil {
		return fmt.Errorf("deleting instance %s: %w", name, err)
	}
	return nil
}

// RebuildInstance makes the root of a stopped instance anew from source,
// keeping its configuration and devices.
func (c *Client) RebuildInstance(ctx context.Context, name string, source InstanceSource) error {
	body := map[string]any{"source": source}
	_, err := c.Run(ctx, http.MethodPost, instancePath(name)+"/rebuild", nil, body, "")
	if err != nil {
		return fmt.Errorf("rebuilding instance %s: %w", name, err)
	}
	return nil
}
