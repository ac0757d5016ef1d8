package testenv

import "fmt"

// ForkBomb is a python3 program that forks up to n children (each sleeping
// sleep seconds), prints how many it made once a fork is refused or n are
// made, and kills its process group: what an agent does to take a node's
// process table.
func ForkBomb(n, sleep int) string {
	return fmt.Sprintf(`
import os, time
made = 0
for i in range(%d):
    try:
        if os.fork() == 0:
            time.sleep(%d)
            os._exit(0)
        made += 1
    except OSError:
        break
print(made, flush=True)
os.killpg(0, 9)
`, n, sleep)
}

// MemoryHog is a python3 program that touches mib MiB, one at a time, and
// prints "touched N" when it got them all.
func MemoryHog(mib int) string {
	return fmt.Sprintf(`
b = bytearray()
for i in range(%d):
    b += b"x" * (1 << 20)
print("touched", len(b) >> 20)
`, mib)
}

// TCPHog is a python3 program that queues up to mib MiB on loopback TCP
// connections nobody reads, connection after connection until a send
// would block on each, prints "queued N" (MiB), and holds them for hold
// seconds.
func TCPHog(mib, hold int) string {
	return fmt.Sprintf(`
import socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(512)
keep, total = [], 0
for i in range(400):
    if total >= %d << 20:
        break
    c = socket.create_connection(srv.getsockname())
    keep += [c, srv.accept()[0]]
    c.setblocking(False)
    try:
        while total < %d << 20:
            total += c.send(b"x" * 65536)
    except BlockingIOError:
        pass
print("queued", total >> 20, flush=True)
time.sleep(%d)
`, mib, mib, hold)
}
