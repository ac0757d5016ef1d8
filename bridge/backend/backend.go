// Package backend is the registry of sandbox backends, where the API meets
// the drivers. A backend package describes itself in one Backend: the rules
// its part of a spec must follow, what it adds to the runtimes.Instance of
// a spec, what a SandboxClass holds it to, and how the manager builds its
// driver from its command-line flags. The callers (bridge/instance,
// bridge/sandboxclass, the sandbox.toml loader, the manager) look a
// backend up here and never name one, so a new backend is its own package
// and one Register line (bridge/backend/all).
//
// The rules common to every backend stay in api/v1alpha1
// (ValidateSandboxSpec), which cannot import this package.
//
// A backend's driver (its flags and constructor, in its runtimes/<name>
// package) is registered apart, with RegisterDriver, by the program that
// runs drivers (the manager): describing and validating a spec then links
// no driver, so sandboxctl and the drivers' own tests carry no other
// backend's client.
package backend

import (
	"cmp"
	"flag"
	"fmt"
	"maps"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Backend is what a backend package tells the rest of the controller about
// itself. Only Name is required; a nil hook means the backend has nothing
// of its own there (bwrap has no settings of its own).
type Backend struct {
	// Name is the value of spec.backend that selects the backend.
	Name v1alpha1.Backend
	// Validate returns the rules of the backend's own settings that spec
	// breaks, each naming its field (spec.<name> for settings of its own).
	// The rules every backend shares are ValidateSpec's, not its.
	Validate func(spec *v1alpha1.SandboxSpec) field.ErrorList
	// Describe copies the backend's settings of a valid spec into in (its
	// image, its config) after the fields every backend shares are set.
	// Whatever it sets enters the ConfigHash of every instance of the
	// backend, so it only ever adds fields a new setting needs.
	Describe func(spec *v1alpha1.SandboxSpec, in *runtimes.Instance)
	// Class holds the backend's settings of spec to class (allowed images,
	// size limits) and fills out, spec with the class applied, with the
	// class's defaults. It returns one message per broken rule, each
	// naming the field and the class, as sandboxclass.Effective does.
	Class func(class *v1alpha1.SandboxClass, spec, out *v1alpha1.SandboxSpec) []string
}

// DriverFlags binds a driver's command-line flags, with their defaults,
// on fs before it is parsed, and returns what builds the driver from them
// (runtimes.Constructor). The manager binds every registered driver's
// flags, enabled or not, so that a command line naming a flag of a
// backend the node leaves off is still accepted.
type DriverFlags func(fs *flag.FlagSet) runtimes.Constructor

var (
	mu         sync.RWMutex
	registered = map[v1alpha1.Backend]Backend{}
	drivers    = map[v1alpha1.Backend]DriverFlags{}
)

// Register makes b known to every caller. A backend without a name, or
// one whose name is taken, panics: two packages claiming one backend is a
// mistake of the build, found at start.
func Register(b Backend) {
	if b.Name == "" {
		panic("backend: registering a backend without a name")
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registered[b.Name]; dup {
		panic(fmt.Sprintf("backend: %q registered twice", b.Name))
	}
	registered[b.Name] = b
}

// Lookup is the registered backend called name.
func Lookup(name v1alpha1.Backend) (Backend, bool) {
	mu.RLock()
	defer mu.RUnlock()
	b, ok := registered[name]
	return b, ok
}

// All are the registered backends, sorted by name.
func All() []Backend {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Backend, 0, len(registered))
	for _, b := range registered {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Backend) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Names are the names of the registered backends, sorted: the list that
// messages and the local control plane's class show.
func Names() []v1alpha1.Backend {
	all := All()
	out := make([]v1alpha1.Backend, len(all))
	for i, b := range all {
		out[i] = b.Name
	}
	return out
}

// RegisterDriver gives the registered backend name its driver. A driver
// of no registered backend, or a second one, panics.
func RegisterDriver(name v1alpha1.Backend, flags DriverFlags) {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := registered[name]; !ok || flags == nil {
		panic(fmt.Sprintf("backend: registering a driver for %q, which is not a registered backend (or without flags)", name))
	}
	if _, dup := drivers[name]; dup {
		panic(fmt.Sprintf("backend: driver of %q registered twice", name))
	}
	drivers[name] = flags
}

// Drivers are the registered drivers, by backend.
func Drivers() map[v1alpha1.Backend]DriverFlags {
	mu.RLock()
	defer mu.RUnlock()
	return maps.Clone(drivers)
}
