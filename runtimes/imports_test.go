package runtimes

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// apiPrefix is the module's API: drivers see only runtimes types, so no
// package under runtimes/, nor the exec policy they call, may depend on it,
// directly or through another package. internal/instance maps the API to
// runtimes types above the drivers.
const apiPrefix = "github.com/cireilclaw/sandbox-controller/api/"

func TestDriversDoNotDependOnTheAPI(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool lists the packages' dependencies: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-json=ImportPath,Deps", "./...", "../internal/policy")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var checked int
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list's output: %v", err)
		}
		checked++
		for _, d := range p.Deps {
			if strings.HasPrefix(d, apiPrefix) {
				t.Errorf("%s depends on %s; drivers and the exec policy take runtimes types only (map in internal/instance)", p.ImportPath, d)
			}
		}
	}
	if checked < 9 {
		t.Fatalf("go list reported %d packages; expected every package under runtimes/ and internal/policy", checked)
	}
}
