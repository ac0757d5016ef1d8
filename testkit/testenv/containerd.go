package testenv

import "os"

// The test containerd's variables, as `hack/containerd.sh env` exports
// them; every test reads them here.
const (
	ContainerdAddressEnv  = "CONTAINERD_ADDRESS"
	ContainerdFIFODirEnv  = "CONTAINERD_FIFO_DIR"
	ContainerdImageTarEnv = "CONTAINERD_TEST_IMAGE_TAR"
)

// ContainerdHowToStart says how to get the test containerd.
const ContainerdHowToStart = `run the tests with make test, or start the test daemon first: eval "$(hack/containerd.sh start)"`

// Containerd is the test containerd hack/containerd.sh runs.
type Containerd struct {
	// Address is its socket.
	Address string
	// FIFODir is where exec FIFOs are made, shared with its shims; empty
	// for containerd's default.
	FIFODir string
	// ImageTar is the test image to import (a busybox-based tarball).
	ImageTar string
}

// ContainerdEnv is the test containerd, or Missing (a failure under CI)
// when it is not running; withImage also needs its test image.
func ContainerdEnv(t TB, withImage bool) Containerd {
	t.Helper()
	c := Containerd{Address: os.Getenv(ContainerdAddressEnv), FIFODir: os.Getenv(ContainerdFIFODirEnv), ImageTar: os.Getenv(ContainerdImageTarEnv)}
	switch {
	case c.Address == "":
		Missing(t, "containerd ("+ContainerdAddressEnv+" is not set)", ContainerdHowToStart)
	case withImage && c.ImageTar == "":
		Missing(t, "containerd's test image ("+ContainerdImageTarEnv+" is not set)", ContainerdHowToStart)
	}
	return c
}
