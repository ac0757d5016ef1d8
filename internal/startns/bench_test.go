package startns_test

import (
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/startns"
)

// typicalHost is what a bubblewrap start with the host's system names:
// its system directories, /etc files, one command and the binaries.
var typicalHost = &startns.Host{
	Binds: []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
		"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/localtime", "/etc/ld.so.cache",
		"/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/alternatives",
		"/usr/bin/true", "/dev", "/dev/bus/usb"},
	Paths: []string{"/usr/bin/bwrap"},
}

// BenchmarkStart is a start namespace's making: with all of the host's
// mounts, and with what a bubblewrap start names.
func BenchmarkStart(b *testing.B) {
	if testing.Short() {
		b.Skip()
	}
	ns := startns.New("")
	for _, c := range []struct {
		name string
		host *startns.Host
	}{{"whole-host", nil}, {"named", typicalHost}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := ns.RunWith(nil, c.host, nil, func() error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
