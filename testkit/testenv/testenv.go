// Package testenv finds the real dependencies tests use (envtest binaries,
// bwrap, git) and decides what a missing one means: under CI (CI=true) it is
// a failure, because a skipped suite there is a hidden red build; on a
// developer machine it is a skip that says how to get the dependency.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// InCI reports whether the tests run in CI, where nothing may be skipped.
func InCI() bool {
	v, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && v
}

// RaceStartsEnv sets how many command starts the mount-destination race
// tests make. `make test` runs them with a few in its parallel pass and
// then once more each, alone, at full strength, so their 10,000 starts do
// not compete with the other suites for the mount table.
const RaceStartsEnv = "SANDBOX_RACE_STARTS"

// FullRaceStarts is what the boundary issue asks of a race test.
const FullRaceStarts = 10000

// RaceStarts is how many starts a race test makes: RaceStartsEnv when set,
// else FullRaceStarts under CI and quick elsewhere.
func RaceStarts(quick int) int {
	if n, err := strconv.Atoi(os.Getenv(RaceStartsEnv)); err == nil && n > 0 {
		return n
	}
	if InCI() {
		return FullRaceStarts
	}
	return quick
}

// TB is the part of testing.TB (or a Ginkgo adapter) this package needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Missing fails the test in CI and skips it elsewhere.
func Missing(t TB, what, how string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is missing and CI=true, so this fails instead of skipping: %s", what, how)
	}
	t.Skipf("%s is missing (not CI, so skipping): %s", what, how)
}

// Binary returns the path of a host command, or handles its absence.
func Binary(t TB, name, how string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name, how)
	}
	return p
}

// AssetsProblem says what is wrong with KUBEBUILDER_ASSETS, or "" when it
// holds kube-apiserver and etcd.
func AssetsProblem() string {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)"
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Sprintf("%s not found in KUBEBUILDER_ASSETS=%s: run hack/envtest-assets.sh", b, dir)
		}
	}
	return ""
}

// CRDDir is config/crd/bases relative to a package directory depth levels
// below the repository root.
func CRDDir(depth int) string {
	p := "config/crd/bases"
	for range depth {
		p = filepath.Join("..", p)
	}
	return p
}
