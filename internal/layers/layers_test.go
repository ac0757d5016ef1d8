// Package layers holds only a test: the packages of the module import in
// one direction, from the top (controllers, front ends, commands) down to
// the drivers and from the drivers down to the API and the host-facing
// packages below them (docs/architecture.md, Packages).
package layers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/cireilclaw/sandbox-controller/"

// layer of a package of the module, lowest first, and its group: the
// top-level folder it belongs to; -1 for test suites and tooling, which may
// import anything.
func layer(pkg string) (int, string, bool) {
	rel := strings.TrimPrefix(pkg, module)
	group := ""
	top := func(prefixes ...string) bool {
		for _, p := range prefixes {
			if rel == p || strings.HasPrefix(rel, p+"/") {
				group = p
				return true
			}
		}
		return false
	}
	switch {
	case top("internal/layers", "test", "hack", "testkit/cluster"):
		return -1, group, true
	case top("config"):
		return 0, group, true
	case top("api", "internal", "testkit/testenv", "testkit/egresstest/probe", "testkit/egresstest/inside"):
		return 0, group, true
	case top("runtimes", "testkit/runtimetest"):
		return 1, group, true
	case top("bridge"):
		return 2, group, true
	case top("testkit/testharness", "testkit/egresstest"):
		// The controllers' test kit: it runs them.
		return 3, "controllers", true
	case top("controllers", "frontends"):
		return 3, group, true
	case top("cmd", "clients"):
		return 4, group, true
	case top("examples"):
		return 5, group, true
	}
	return 0, "", false
}

// siblingsApart are the layers whose groups never import one another: a
// front end never reaches into the controllers (nor they into it), and a
// command never into the clients.
var siblingsApart = map[int]bool{3: true, 4: true}

var names = []string{"the API and host-facing packages", "the drivers", "where the API meets the drivers",
	"controllers and front ends", "commands and clients", "examples"}

// testsReach is the one allowance for tests: a driver's tests describe
// their instances from real specs, through the bridge above the drivers
// (bridge/instance), which the driver itself never imports. The bridge
// links no driver (the manager registers them), so the tests inside a
// driver's package can too.
var testsReach = map[int]int{1: 2}

// goPackage is what go list says of a package.
type goPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Deps         []string
}

// goList lists patterns (relative to this directory) with their imports
// and dependencies.
func goList(t *testing.T, patterns ...string) []goPackage {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool lists the packages' imports: %v", err)
	}
	cmd := exec.Command(goTool, append([]string{"list", "-json=ImportPath,Imports,TestImports,XTestImports,Deps"}, patterns...)...)
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

// misplaced says why a package (at own, in group) may not import imp,
// or ""; reach is the highest layer it may import.
func misplaced(own, reach int, group, imp string) string {
	if !strings.HasPrefix(imp, module) {
		return ""
	}
	l, g, ok := layer(imp)
	switch {
	case !ok || l < 0:
		return ""
	case l > reach:
		return fmt.Sprintf("%s, a layer above it (%s)", imp, names[l])
	case l == own && g != group && siblingsApart[own]:
		return fmt.Sprintf("%s, of %s beside it in %s: those never import one another", imp, g, names[l])
	}
	return ""
}

// Production code and test files alike: a test of a driver that pulls in
// the controllers (through a test kit) breaks its layer as much as the
// driver would.
func TestPackagesImportOnlyFromTheirLayerOrBelow(t *testing.T) {
	checked := 0
	for _, p := range goList(t, "../../...") {
		own, group, ok := layer(p.ImportPath)
		if !ok {
			t.Errorf("%s has no layer: give it one here and in docs/architecture.md", p.ImportPath)
			continue
		}
		if own < 0 {
			continue
		}
		checked++
		for _, imp := range p.Imports {
			if why := misplaced(own, own, group, imp); why != "" {
				t.Errorf("%s (%s) imports %s", p.ImportPath, names[own], why)
			}
		}
		for _, imp := range append(p.TestImports, p.XTestImports...) {
			if imp == p.ImportPath {
				continue
			}
			reach := own
			if r, ok := testsReach[own]; ok {
				reach = r
			}
			if why := misplaced(own, reach, group, imp); why != "" {
				t.Errorf("the tests of %s (%s) import %s", p.ImportPath, names[own], why)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("go list reported %d layered packages; expected the whole module", checked)
	}
}

// A driver's tests may reach the bridge, and no higher.
func TestDriverTestsReachTheBridgeOnly(t *testing.T) {
	own, group, _ := layer(module + "runtimes/bwrap")
	if why := misplaced(own, testsReach[own], group, module+"bridge/instance"); why != "" {
		t.Errorf("a driver's test describing an instance: %s", why)
	}
	if why := misplaced(own, testsReach[own], group, module+"controllers"); why == "" {
		t.Error("a driver's test may import the controllers")
	}
}

// The rule itself: each kind of break is caught.
func TestMisplacedImportsAreNamed(t *testing.T) {
	for _, tc := range []struct {
		pkg, imp string
		bad      bool
	}{
		{"frontends/execapi", "controllers", true},
		{"controllers", "frontends/execapi", true},
		{"cmd/sandboxctl", "clients/go/sandboxclient", true},
		{"runtimes/bwrap", "testkit/testharness", true},
		{"runtimes/bwrap", "bridge/instance", true},
		{"runtimes/bwrap", "bridge/backend", true},
		{"bridge/backend/bwrap", "runtimes/bwrap", false},
		{"internal/areas", "bridge/instance", true},
		{"internal/areas", "runtimes", true},
		{"testkit/testenv", "testkit/testharness", true},
		{"testkit/runtimetest", "bridge/instance", true},
		{"bridge/instance", "bridge/backend/all", false},
		{"bridge/backend", "controllers", true},
		{"frontends/execapi", "testkit/testharness", true},
		{"controllers", "bridge/instance", false},
		{"cmd/sandboxctl", "frontends/execapi", false},
		{"clients/go/sandboxtest", "controllers", false},
		{"runtimes/bwrap", "testkit/runtimetest", false},
		{"frontends/execapi", "frontends/mcpserver", false},
		{"controllers", "testkit/testharness", false},
	} {
		own, group, _ := layer(module + tc.pkg)
		if got := misplaced(own, own, group, module+tc.imp) != ""; got != tc.bad {
			t.Errorf("%s importing %s: misplaced %v, want %v", tc.pkg, tc.imp, got, tc.bad)
		}
	}
}

// Drivers see only runtimes types: no package under runtimes/, nor the
// exec policy they call, may depend on the API, directly or through
// another package. bridge/instance maps the API to runtimes types above
// the drivers.
func TestDriversDoNotDependOnTheAPI(t *testing.T) {
	pkgs := goList(t, "../../runtimes/...", "../policy")
	for _, p := range pkgs {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module+"api/") {
				t.Errorf("%s depends on %s; drivers and the exec policy take runtimes types only (map in bridge/instance)", p.ImportPath, d)
			}
		}
	}
	if len(pkgs) < 9 {
		t.Fatalf("go list reported %d packages; expected every package under runtimes/ and internal/policy", len(pkgs))
	}
}
