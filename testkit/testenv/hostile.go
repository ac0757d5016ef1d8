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
