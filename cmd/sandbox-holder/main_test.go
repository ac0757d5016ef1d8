package main

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestInstallCopiesTheRunningBinaryReadOnly(t *testing.T) {
	dir := t.TempDir()
	if err := install(dir); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, Name))
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, self) {
		t.Errorf("the copy differs from the running binary (%d bytes, want %d)", len(got), len(self))
	}
	fi, _ := os.Stat(filepath.Join(dir, Name))
	if fi.Mode().Perm() != 0o555 {
		t.Errorf("mode %v, want r-xr-xr-x", fi.Mode().Perm())
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := install(filepath.Join(dir, "missing")); err == nil {
		t.Error("install into a missing directory succeeded")
	}
}

func TestHoldEndsOnSIGTERM(t *testing.T) {
	ready, done := make(chan struct{}), make(chan struct{})
	go func() { hold(ready); close(done) }()
	<-ready
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("hold did not return after SIGTERM")
	}
}
