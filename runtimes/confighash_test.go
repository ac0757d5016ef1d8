package runtimes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/overlay"
)

// hashInstances set every field an Instance has.
func hashInstances() map[string]Instance {
	yes := true
	return map[string]Instance{
		"empty": {},
		"full": {
			Name: "cireilclaw-ada", Agent: "ada", Owner: "team/ada", AgentDir: "/areas/ada",
			Areas: []Bind{{Source: "/areas/ada/workspace", Target: "/workspace"}, {Source: "/areas/ada/blocks", Target: "/blocks", ReadOnly: true}},
			Mounts: []Bind{
				{Source: "/srv/p", Target: "/workspace/p", Anchor: "/srv", NoLinks: true},
				{Source: "/areas/ada/.overlay/o/merged", Target: "/workspace/o", Overlay: &overlay.Layers{Lower: "/srv/o", Upper: "/u", Work: "/w", Merged: "/m",
					SizeLimit: 1 << 20, Owner: 70000, LowerAnchor: "/srv", LowerNoLinks: true, Disk: "/d.img"}},
				{Source: "/srv/p/.git", Target: "/srv/p/.git", GitDir: true},
			},
			Binaries: []string{"git", "sh"}, Devices: Devices{USB: true, All: true}, Env: []string{"TOKEN"}, Image: "img",
			Containerd: &ContainerdConfig{MemoryLimit: &Size{Bytes: 1 << 28, Text: "256Mi"}, PidsLimit: 64, RootfsSizeLimit: &Size{Bytes: 1 << 30, Text: "1Gi"}},
			Incus:      &IncusConfig{Profiles: []string{"default"}, Project: "p", ShutdownOnExit: &yes, RootSizeLimit: &Size{Bytes: 1 << 30, Text: "1Gi"}},
			Identity:   Identity{UID: 70000, GID: 70000}, StopOnExit: true,
			Resources:  Resources{CPUMillis: 500, MemoryBytes: 1 << 28, Pids: 64, CPURequestMillis: 100, MemoryRequestBytes: 1 << 27},
			ConfigHash: "ignored",
		},
	}
}

// The input of ConfigHash version 1 is recorded here as running instances
// carry it: these strings are the encoding an Instance had when the hash
// was first recorded. A change to Instance that changes them would restart
// every running sandbox; change the Instance, never these.
var configV1Encodings = map[string]string{
	"empty": `{"name":"","agent":"","owner":"","agentDir":"","areas":null,"mounts":null,"binaries":null,"devices":{},"passthrough":null,"identity":{"uid":0,"gid":0},"stopOnExit":false,"resources":{}}`,
	"full":  `{"name":"cireilclaw-ada","agent":"ada","owner":"","agentDir":"/areas/ada","areas":[{"source":"/areas/ada/workspace","target":"/workspace","readOnly":false},{"source":"/areas/ada/blocks","target":"/blocks","readOnly":true}],"mounts":[{"source":"/srv/p","target":"/workspace/p","readOnly":false,"anchor":"/srv","noLinks":true},{"source":"/areas/ada/.overlay/o/merged","target":"/workspace/o","readOnly":false,"overlay":{"lower":"/srv/o","upper":"/u","work":"/w","merged":"/m","sizeLimit":1048576,"owner":70000,"lowerAnchor":"/srv","lowerNoLinks":true,"disk":"/d.img"}},{"source":"/srv/p/.git","target":"/srv/p/.git","readOnly":false,"gitDir":true}],"binaries":["git","sh"],"devices":{"usb":true,"all":true},"passthrough":["TOKEN"],"image":"img","containerd":{"image":"img","memoryLimit":"256Mi","pidsLimit":64,"rootfsSizeLimit":"1Gi"},"incus":{"image":"img","profiles":["default"],"project":"p","shutdownOnExit":true,"rootSizeLimit":"1Gi"},"identity":{"uid":70000,"gid":70000},"stopOnExit":true,"resources":{"cpuMillis":500,"memoryBytes":268435456,"pids":64,"cpuRequestMillis":100,"memoryRequestBytes":134217728}}`,
}

func TestConfigHashVersion1IsItsRecordedEncoding(t *testing.T) {
	for name, in := range hashInstances() {
		b, err := json.Marshal(in.configInputV1())
		if err != nil {
			t.Fatal(err)
		}
		if want := configV1Encodings[name]; string(b) != want {
			t.Errorf("%s: ConfigHash version 1 reads\n %s\nwant\n %s", name, b, want)
		}
		sum := sha256.Sum256([]byte(configV1Encodings[name]))
		if got, want := in.Hash(), hex.EncodeToString(sum[:8]); got != want {
			t.Errorf("%s: hash %s, want %s", name, got, want)
		}
	}
}

// Neither the owner nor the recorded hash is configuration: adopting an
// instance under another owner restarts nothing.
func TestConfigHashIgnoresOwnerAndHash(t *testing.T) {
	in := hashInstances()["full"]
	other := in
	other.Owner, other.ConfigHash = "elsewhere/x", "y"
	if in.Hash() != other.Hash() {
		t.Fatal("the owner or the recorded hash changed the ConfigHash")
	}
	other.Mounts = append([]Bind(nil), in.Mounts...)
	other.Mounts[0].NoLinks = false
	if in.Hash() == other.Hash() {
		t.Fatal("a mount's NoLinks did not change the ConfigHash")
	}
}
