// Package layers holds only a test: the packages of the module import in
// one direction, from the top (controllers, front ends, commands) down to
// the drivers and from the drivers down to the API and the host-facing
// packages below them (docs/architecture.md, Packages).
package layers

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/cireilclaw/sandbox-controller/"

// layer of a package of the module, lowest first; -1 for test and tooling
// packages, which may import anything.
func layer(pkg string) (int, bool) {
	rel := strings.TrimPrefix(pkg, module)
	top := func(prefixes ...string) bool {
		for _, p := range prefixes {
			if rel == p || strings.HasPrefix(rel, p+"/") {
				return true
			}
		}
		return false
	}
	switch {
	case top("internal/testenv", "internal/testharness", "internal/layers", "test", "hack"):
		return -1, true
	case top("config"):
		return 0, true
	case top("api", "internal/commandname", "internal/areas", "internal/policy", "internal/overlay",
		"internal/worktree", "internal/tenancy", "internal/exectoken", "internal/localcp", "internal/servingcert", "internal/sizedfs"):
		return 0, true
	case top("runtimes"):
		return 1, true
	case top("internal/instance", "internal/sandboxclass"):
		return 2, true
	case top("controllers", "frontends", "cmd", "clients", "examples"):
		return 3, true
	}
	return 0, false
}

var names = []string{"the API and host-facing packages", "the drivers", "where the API meets the drivers", "controllers, front ends and commands"}

// goPackage is what go list says of a package.
type goPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// goList lists patterns (relative to this directory) with their imports
// and dependencies.
func goList(t *testing.T, patterns ...string) []goPackage {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool lists the packages' imports: %v", err)
	}
	cmd := exec.Command(goTool, append([]string{"list", "-json=ImportPath,Imports,Deps"}, patterns...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatalf("decoding go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
}

func TestPackagesImportOnlyFromTheirLayerOrBelow(t *testing.T) {
	checked := 0
	for _, p := range goList(t, "../../...") {
		own, ok := layer(p.ImportPath)
		if !ok {
			t.Errorf("%s has no layer: give it one here and in docs/architecture.md", p.ImportPath)
			continue
		}
		if own < 0 {
			continue
		}
		checked++
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			l, ok := layer(imp)
			if ok && l > own {
				t.Errorf("%s (%s) imports %s (%s), a layer above it", p.ImportPath, names[own], imp, names[l])
			}
		}
	}
	if checked < 20 {
		t.Fatalf("go list reported %d layered packages; expected the whole module", checked)
	}
}

// Drivers see only runtimes types: no package under runtimes/, nor the
// exec policy they call, may depend on the API, directly or through
// another package. internal/instance maps the API to runtimes types above
// the drivers.
func TestDriversDoNotDependOnTheAPI(t *testing.T) {
	pkgs := goList(t, "../../runtimes/...", "../policy")
	for _, p := range pkgs {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module+"api/") {
				t.Errorf("%s depends on %s; drivers and the exec policy take runtimes types only (map in internal/instance)", p.ImportPath, d)
			}
		}
	}
	if len(pkgs) < 9 {
		t.Fatalf("go list reported %d packages; expected every package under runtimes/ and internal/policy", len(pkgs))
	}
}
