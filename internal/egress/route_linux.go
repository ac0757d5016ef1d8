package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// routeSeq numbers the route queries of this process.
var routeSeq atomic.Uint32

// routedToHost says whether the kernel, asked now, delivers a packet for
// addr to this host itself (a route of type local: loopback, any address
// of any interface, a range routed to lo), as `ip route get` would say.
// Addresses a node gains after its controller started are its own all
// the same; only the kernel knows them at the moment of connecting.
func routedToHost(addr netip.Addr) (bool, error) {
	addr = addr.Unmap()
	family, bits := unix.AF_INET, 32
	if addr.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	raw := addr.AsSlice()
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return false, fmt.Errorf("opening a route socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("binding a route socket: %w", err)
	}
	// The kernel answers at once; a read that waits is refused, not hung.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		return false, fmt.Errorf("bounding a route socket's reads: %w", err)
	}
	attrLen := unix.SizeofRtAttr + len(raw)
	msgLen := unix.SizeofNlMsghdr + unix.SizeofRtMsg + rtaAlign(attrLen)
	seq := routeSeq.Add(1)
	req := make([]byte, msgLen)
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&req[0]))
	*hdr = unix.NlMsghdr{Len: uint32(msgLen), Type: unix.RTM_GETROUTE, Flags: unix.NLM_F_REQUEST, Seq: seq}
	rt := (*unix.RtMsg)(unsafe.Pointer(&req[unix.SizeofNlMsghdr]))
	*rt = unix.RtMsg{Family: uint8(family), Dst_len: uint8(bits)}
	attr := (*unix.RtAttr)(unsafe.Pointer(&req[unix.SizeofNlMsghdr+unix.SizeofRtMsg]))
	*attr = unix.RtAttr{Len: uint16(attrLen), Type: unix.RTA_DST}
	copy(req[unix.SizeofNlMsghdr+unix.SizeofRtMsg+unix.SizeofRtAttr:], raw)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("asking the kernel's route to %s: %w", addr, err)
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("reading the kernel's route to %s: %w", addr, err)
		}
		for b := buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			h := (*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
			if h.Len < unix.SizeofNlMsghdr || int(h.Len) > len(b) {
				return false, fmt.Errorf("the kernel's route to %s: a message of %d bytes in %d", addr, h.Len, len(b))
			}
			body := b[unix.SizeofNlMsghdr:h.Len]
			b = b[min(nlmAlign(int(h.Len)), len(b)):]
			if h.Seq != seq {
				continue
			}
			switch h.Type {
			case unix.NLMSG_ERROR:
				if len(body) < 4 {
					return false, fmt.Errorf("the kernel's route to %s: a short error", addr)
				}
				errno := -int32(binary.NativeEndian.Uint32(body))
				if errno == 0 {
					continue
				}
				// No route (unreachable, prohibited): not this host's.
				return false, nil
			case unix.RTM_NEWROUTE:
				if len(body) < unix.SizeofRtMsg {
					return false, fmt.Errorf("the kernel's route to %s: a short answer", addr)
				}
				got := (*unix.RtMsg)(unsafe.Pointer(&body[0]))
				return got.Type == unix.RTN_LOCAL, nil
			}
		}
	}
}

func rtaAlign(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }
