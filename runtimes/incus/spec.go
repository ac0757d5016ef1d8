package incus

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
)

// DevicePrefix starts the name of every device the driver manages. Devices
// with other names (from profiles or added by hand) are left alone.
const DevicePrefix = "sandbox-"

var unsafeDeviceChars = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// DeviceName names the disk device of a bind: readable, and unique for the
// target even when two targets read the same once slashes are replaced.
func DeviceName(target string) string {
	slug := strings.Trim(unsafeDeviceChars.ReplaceAllString(target, "-"), "-")
	if len(slug) > 32 {
		slug = slug[:32]
	}
	sum := sha256.Sum256([]byte(target))
	return DevicePrefix + slug + "-" + hex.EncodeToString(sum[:4])
}

// usbDevice is the device that passes the host's USB devices through.
const usbDevice = DevicePrefix + "usb"

// Devices are the devices an instance description asks for: one disk
// device per area and per mount, read-only where the description says,
// and the USB devices when asked. The git directories of worktrees are
// not devices: Incus would bind them by path, in a mount the agent writes
// to; they are bound from handles after the instance starts
// (runtimes/mountns).
func Devices(in runtimes.Instance) (map[string]incusapi.Device, error) {
	if in.Devices.All {
		return nil, fmt.Errorf("devices.all is not available with the incus backend: Incus gives a container host devices one by one; " +
			"add the ones the agent needs to a profile listed in spec.incus.profiles")
	}
	out := map[string]incusapi.Device{}
	for _, b := range slices.Concat(in.Areas, in.Mounts) {
		if b.GitDir {
			continue
		}
		d := incusapi.Device{"type": "disk", "source": b.Source, "path": b.Target}
		if b.ReadOnly {
			d["readonly"] = "true"
		}
		out[DeviceName(b.Target)] = d
	}
	if in.Devices.USB {
		// A usb device without vendor or product matches every USB device.
		out[usbDevice] = incusapi.Device{"type": "usb"}
	}
	return out, nil
}

// mergeDevices replaces the driver's devices in current with want and
// keeps every other device.
func mergeDevices(current, want map[string]incusapi.Device) map[string]incusapi.Device {
	out := map[string]incusapi.Device{}
	for k, v := range current {
		if !strings.HasPrefix(k, DevicePrefix) {
			out[k] = v
		}
	}
	for k, v := range want {
		out[k] = v
	}
	return out
}

// ownDevices are the driver's devices of an instance.
func ownDevices(devs map[string]incusapi.Device) map[string]incusapi.Device {
	out := map[string]incusapi.Device{}
	for k, v := range devs {
		if strings.HasPrefix(k, DevicePrefix) {
			out[k] = v
		}
	}
	return out
}

func devicesEqual(a, b map[string]incusapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for k, da := range a {
		db, ok := b[k]
		if !ok || len(da) != len(db) {
			return false
		}
		for o, v := range da {
			if db[o] != v {
				return false
			}
		}
	}
	return true
}

func encodeInstance(in runtimes.Instance) (string, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return "", fmt.Errorf("recording the instance description: %w", err)
	}
	return string(b), nil
}

// decodeInstance reads the description an instance was last converged to.
func decodeInstance(inst *incusapi.Instance) (runtimes.Instance, error) {
	var in runtimes.Instance
	raw := inst.Config[KeyInstance]
	if raw == "" {
		return in, fmt.Errorf("instance %s carries no %s", inst.Name, KeyInstance)
	}
	if err := json.Unmarshal([]byte(raw), &in); err != nil {
		return in, fmt.Errorf("instance %s: decoding %s: %w", inst.Name, KeyInstance, err)
	}
	in.ConfigHash = inst.Config[KeyConfigHash]
	return in, nil
}

// Change is what differs between the description an instance was
// converged to and the one asked for.
type Change struct {
	// Restart lists what a running instance cannot take live, for the
	// RestartRequired message; empty when everything applies live.
	Restart []string
	// Image is set when the image changed: the root is rebuilt from the
	// new image, so container-local state does not carry over.
	Image bool
}

// NeedsRestart says whether a running instance must stop to take the change.
func (c Change) NeedsRestart() bool { return len(c.Restart) > 0 }

func (c Change) String() string { return strings.Join(c.Restart, ", ") }

// Diff says what of a change needs a restart: the image and the identity
// mapping. Areas, mounts and devices are hot-plugged; the allowlist,
// passthrough names and root size limit are read at each command or
// health check; profiles apply when an instance is created.
func Diff(old, new runtimes.Instance, oldIdmap, newIdmap string) Change {
	var c Change
	if old.Image != new.Image {
		c.Image = true
		c.Restart = append(c.Restart, fmt.Sprintf("image %q → %q", old.Image, new.Image))
	}
	if oldIdmap != newIdmap {
		c.Restart = append(c.Restart, "raw.idmap")
	}
	return c
}

// imageSource turns an image reference into the source of a new instance:
// "remote:alias" pulls from a known remote; anything else is a local alias
// or fingerprint.
func (r *Runtime) imageSource(ref string) (incusapi.InstanceSource, bool, error) {
	if remote, alias, ok := strings.Cut(ref, ":"); ok {
		rm, known := r.cfg.Remotes[remote]
		if !known {
			names := make([]string, 0, len(r.cfg.Remotes))
			for n := range r.cfg.Remotes {
				names = append(names, n)
			}
			slices.Sort(names)
			return incusapi.InstanceSource{}, false, fmt.Errorf("image %q names the remote %q, which the controller does not know (known: %v)", ref, remote, names)
		}
		return incusapi.InstanceSource{Type: "image", Mode: "pull", Server: rm.Server, Protocol: rm.Protocol, Alias: alias}, true, nil
	}
	return incusapi.InstanceSource{Type: "image", Alias: ref}, false, nil
}
