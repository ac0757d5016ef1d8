//go:build !linux

package egress

import "net/netip"

// routedToHost is Linux's: elsewhere no proxy serves a Sandbox.
func routedToHost(netip.Addr) (bool, error) { return false, nil }
