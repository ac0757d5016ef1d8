// Command image builds the controller's OCI image without a container
// engine or an image registry: the static controller binary, and bubblewrap
// and git with the shared libraries they load, taken from Debian packages
// (apt-get download from the machine's configured apt sources), with a
// minimal /etc. It writes an OCI image layout tarball that `ctr images
// import` and registry clients (crane push, skopeo copy oci-archive:) take.
//
// It is a module of its own so the controller's go.mod never carries an
// image library.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// defaultPackages ship bwrap, git and every library they load on Debian
// bookworm; a library found in none of them fails the build by name.
const defaultPackages = "bubblewrap,git,libc6,libcap2,libselinux1,libpcre2-8-0,zlib1g"

func main() {
	var c config
	flag.StringVar(&c.controller, "controller", "bin/image/sandbox-controller", "the controller binary, built with CGO_ENABLED=0 (a dynamically linked one is refused)")
	flag.StringVar(&c.holder, "holder", "bin/image/sandbox-holder", "the holder binary (cmd/sandbox-holder), built with CGO_ENABLED=0")
	flag.StringVar(&c.debDir, "debs", "bin/image/debs", "directory of the Debian packages; a missing one is fetched with apt-get download")
	flag.StringVar(&c.packages, "packages", defaultPackages, "comma-separated Debian packages the image's files come from")
	flag.StringVar(&c.name, "name", "sandbox-controller", "image name (a name without a registry is docker.io/library/NAME, as the kubelet reads it)")
	flag.StringVar(&c.version, "version", "dev", "image tag and org.opencontainers.image.version")
	flag.StringVar(&c.out, "out", "bin/sandbox-controller-image.tar", "OCI image layout tarball to write")
	flag.Int64Var(&c.epoch, "epoch", 0, "timestamp of every file and of the image, seconds since 1970 (SOURCE_DATE_EPOCH): the same inputs give the same image")
	flag.StringVar(&c.arch, "arch", runtime.GOARCH, "image architecture (Debian packages of the same architecture)")
	flag.Parse()
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" && c.epoch == 0 {
		if _, err := fmt.Sscan(v, &c.epoch); err != nil {
			fail(fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err))
		}
	}
	ref, size, err := build(c)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s: %s (%.1f MiB)\n", c.out, ref, float64(size)/(1<<20))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}

type config struct {
	controller, holder, debDir, packages string
	name, version, out, arch             string
	epoch                                int64
}

func (c config) packageList() []string {
	var out []string
	for _, p := range strings.Split(c.packages, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// imageRef is the full reference the image is stored under, normalised
// the way the kubelet and ctr normalise a short name.
func imageRef(name, tag string) string {
	first, _, hasSlash := strings.Cut(name, "/")
	switch {
	case !hasSlash:
		name = "docker.io/library/" + name
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		name = "docker.io/" + name
	}
	return name + ":" + tag
}
