package incus

import (
	"context"
	"flag"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Flags binds incusd's socket on fs.
func Flags(fs *flag.FlagSet) runtimes.Constructor {
	var cfg Config
	fs.StringVar(&cfg.Socket, "incus-socket", DefaultSocket(), "incusd's unix socket for the incus backend (default $INCUS_SOCKET, else under $INCUS_DIR, else /var/lib/incus/unix.socket)")
	return func(context.Context, string) (runtimes.Runtime, func(), error) {
		rt, err := New(cfg)
		if err != nil {
			return nil, nil, err
		}
		return rt, nil, nil
	}
}
