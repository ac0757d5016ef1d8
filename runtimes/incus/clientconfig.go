package incus

import (
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// clientConfig is the part of the incus command's config.yml that says
// which project the caller is in.
type clientConfig struct {
	DefaultRemote string `json:"default-remote"`
	Remotes       map[string]struct {
		Addr    string `json:"addr"`
		Project string `json:"project"`
	} `json:"remotes"`
}

// CurrentProject is the caller's current Incus project, as `incus project
// switch` records it for the local daemon in the incus command's
// configuration (INCUS_CONF, else ~/.config/incus); empty when none is
// recorded, which means the daemon's default project.
func CurrentProject() string {
	dir := os.Getenv("INCUS_CONF")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".config", "incus")
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.yml"))
	if err != nil {
		return ""
	}
	return projectIn(b)
}

func projectIn(b []byte) string {
	var cfg clientConfig
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return ""
	}
	// Only the local daemon is this driver's: a default remote elsewhere
	// says nothing of the project on the local socket.
	remote := cfg.DefaultRemote
	if remote == "" {
		remote = "local"
	}
	rm, ok := cfg.Remotes[remote]
	if !ok || (rm.Addr != "" && rm.Addr != "unix://") {
		return ""
	}
	return rm.Project
}
