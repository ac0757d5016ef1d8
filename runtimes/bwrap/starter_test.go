package bwrap

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A configured starter runs as root: one another user could change stops
// the driver with an error that says why; a fit one is used.
func TestConfiguredStarterIsCheckedBeforeUse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sandbox-holder")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o777); err != nil {
		t.Fatal(err)
	}
	var warnings bytes.Buffer
	if got, err := findStarter(p, &warnings); err == nil || !strings.Contains(err.Error(), "written by its group or others") {
		t.Errorf("a world-writable starter: %q, %v; want a refusal that says so", got, err)
	}
	if _, err := New(Config{StateDir: filepath.Join(t.TempDir(), "state"), Starter: p, Warnings: &warnings}); err == nil {
		t.Error("the driver started with a world-writable starter")
	}
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := findStarter(p, &warnings); got != p || err != nil {
		t.Errorf("a fit starter: %q, %v; want it used", got, err)
	}
	if _, err := findStarter(filepath.Join(t.TempDir(), "absent"), &warnings); err == nil {
		t.Error("a configured starter that is not there is no error")
	}
}
