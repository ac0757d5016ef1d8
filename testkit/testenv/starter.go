package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

var starter struct {
	once sync.Once
	path string
	err  error
}

// Starter builds the cgroup v1 starter (cmd/sandbox-holder) once per test
// process, into the repository's bin/test, and returns its path: the
// controller finds it beside its own binary, which a test binary is not.
func Starter(t TB) string {
	t.Helper()
	starter.once.Do(func() { starter.path, starter.err = buildStarter() })
	if starter.err != nil {
		t.Fatalf("building the starter: %v", starter.err)
	}
	return starter.path
}

func buildStarter() (string, error) {
	env, cancel := Command(time.Minute, "go", "env", "GOMOD")
	defer cancel()
	out, err := env.Output()
	mod := strings.TrimSpace(string(out))
	if err != nil {
		return "", fmt.Errorf("finding the module: go env GOMOD: %w", err)
	}
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("finding the module: go env GOMOD says %q: run the tests inside the repository", mod)
	}
	dir := filepath.Join(filepath.Dir(mod), "bin", "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Built under a name of its own and renamed: test processes build it
	// at the same time, and a rename is whole.
	final := filepath.Join(dir, "sandbox-holder")
	tmp := final + "." + strconv.Itoa(os.Getpid())
	cmd, cancelBuild := Command(10*time.Minute, "go", "build", "-o", tmp, "./cmd/sandbox-holder")
	defer cancelBuild()
	cmd.Dir = filepath.Dir(mod)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build ./cmd/sandbox-holder: %w: %s", err, b)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return final, nil
}
