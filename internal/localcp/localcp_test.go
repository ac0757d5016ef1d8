package localcp

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// A start that fails once kube-apiserver and etcd are up (here: a CRD
// directory that does not exist, as a mistyped --local-crds gives) stops
// them: the controller exits with the error, and nothing of the local
// control plane runs on after it.
func TestAFailedStartLeavesNoControlPlane(t *testing.T) {
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(t, "kube-apiserver and etcd", p)
	}
	dir := t.TempDir()
	cp, err := Start(os.Getenv("KUBEBUILDER_ASSETS"), filepath.Join(dir, "no-such-crds"), filepath.Join(dir, "kubeconfig"))
	if err == nil {
		_ = cp.Stop()
		t.Fatal("the local control plane started with a CRD directory that does not exist")
	}
	if !strings.Contains(err.Error(), "no-such-crds") {
		t.Errorf("the error does not name the CRD directory: %v", err)
	}
	if left := children(t, "kube-apiserver", "etcd"); len(left) > 0 {
		for _, pid := range left {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
				_, _ = p.Wait()
			}
		}
		t.Fatalf("after the failed start, processes %v of the local control plane still ran", left)
	}
}

// children lists this process's children whose command is one of names.
func children(t *testing.T, names ...string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold blanks and parentheses.
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || fields[1] != self || fields[0] == "Z" {
			continue
		}
		for _, n := range names {
			if s[open+1:end] == n {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// A key, certificate or kubeconfig written where a file already was (a
// looser mode, a link another user put in a shared directory) is a new
// file of its own mode: the old one's mode is not kept and a link's target
// is never written.
func TestServingCertReplacesWhatWasThere(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other-users-file")
	if err := os.WriteFile(other, []byte("theirs"), 0o666); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, filepath.Join(certs, "tls.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certs, "ca.crt"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	_, _, keyFile, err := ServingCert(certs)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != "theirs" {
		t.Errorf("the link's target was written: %q, %v", b, err)
	}
	fi, err := os.Lstat(keyFile)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("tls.key is %v (%v), want a regular file of mode 0600", fi.Mode(), err)
	}
	if fi, err := os.Lstat(filepath.Join(certs, "ca.crt")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("ca.crt kept its mode %v (%v), want 0644", fi.Mode(), err)
	}
}
