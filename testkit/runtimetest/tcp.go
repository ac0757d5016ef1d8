package runtimetest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// TCPMemory is the memory limit TCPBuffers expects the instance to have.
const TCPMemory = 128 << 20

// tcpConnections is how many loopback connections TCPBuffers opens: two
// processes each (busybox nc at both ends), about 3.5 MiB queued on each
// where nothing bounds them, 430 MiB in all.
const tcpConnections = 120

// tcpHog is a busybox shell script that opens tcpConnections loopback
// connections whose receiving end reads nothing (its nc blocks writing to
// a FIFO nobody reads) while the sending end writes zeros, waits until
// the bytes queued on them stop growing, and prints "queued N" (MiB, the
// send and receive queues of /proc/net/tcp), or fails if not every
// connection was made (no loopback, say). The nc processes go on
// holding the connections after the script ends.
var tcpHog = fmt.Sprintf(`
n=%d
queued() {
  t=0
  { read -r _; while read -r _ _ _ _ q _; do t=$((t + 0x${q%%:*} + 0x${q#*:})); done; } < /proc/net/tcp
  echo $((t >> 20))
}
listening() {
  l=0
  { read -r _; while read -r _ _ _ st _; do [ "$st" = 0A ] && l=$((l + 1)); done; } < /proc/net/tcp
  echo $l
}
cd /tmp && rm -f tcphog.out tcphog.in && mkfifo tcphog.out tcphog.in || exit 1
exec 3<>tcphog.out 4<>tcphog.in
i=0; while [ $i -lt $n ]; do nc -l -p $((40000 + i)) <&4 >&3 2>/dev/null & i=$((i + 1)); done
w=0; while [ "$(listening)" -lt $n ] && [ $w -lt 100 ]; do sleep 0.1; w=$((w + 1)); done
i=0; while [ $i -lt $n ]; do nc 127.0.0.1 $((40000 + i)) </dev/zero >/dev/null 2>&1 & i=$((i + 1)); done
last=-1; now=$(queued); w=0
while [ "$now" != "$last" ] && [ $w -lt 60 ]; do sleep 0.5; last=$now; now=$(queued); w=$((w + 1)); done
c=0
{ read -r _; while read -r _ _ _ st _; do [ "$st" = 01 ] && c=$((c + 1)); done; } < /proc/net/tcp
[ $c -ge $n ] || { echo "only $c of $n connections made"; exit 1; }
echo queued $now
`, tcpConnections)

// TCPBuffers drives an instance with a memory limit of TCPMemory, a pids
// limit of at least 512 (or none), busybox's sh and nc and a loopback
// interface that is up, through a
// driver that reports usage: data queued on loopback TCP connections
// nobody reads stays near the memory limit (cgroup v1 charges a cgroup's
// sockets to nothing until it has a TCP limit of its own; v2 charges
// them to the memory limit), and the memory used counts it.
func TCPBuffers(t T, rt runtimes.Runtime, in runtimes.Instance) {
	t.Helper()
	ctx := context.Background()
	ur, ok := rt.(runtimes.UsageReader)
	if !ok {
		t.Fatalf("%T does not report usage", rt)
	}
	if in.Resources.MemoryBytes != TCPMemory || in.Resources.Pids > 0 && in.Resources.Pids < 2*tcpConnections+16 {
		t.Fatalf("the instance's limits are %+v, want memory %d and pids at least %d", in.Resources, TCPMemory, 2*tcpConnections+16)
	}
	if _, err := rt.Ensure(ctx, in); err != nil {
		t.Fatal(err)
	}
	exec := func(script string) (int, string) {
		t.Helper()
		var out strings.Builder
		st, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return st.Code, out.String()
	}
	defer func() {
		exec("killall nc; rm -f /tmp/tcphog.out /tmp/tcphog.in; exit 0")
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			u, err := ur.Usage(in.Name)
			if err == nil && u.Pids <= 4 || time.Now().After(deadline) {
				return
			}
		}
	}()

	code, out := exec(tcpHog)
	var queued int64
	if _, err := fmt.Sscanf(out, "queued %d", &queued); err != nil || code != 0 {
		t.Fatalf("the TCP hog: exit %d, %q", code, out)
	}
	t.Log(fmt.Sprintf("queued %d MiB on %d connections under a %d MiB memory limit", queued, tcpConnections, TCPMemory>>20))
	if limit := int64(TCPMemory>>20) * 5 / 4; queued > limit {
		t.Fatalf("a command queued %d MiB on TCP connections under a %d MiB memory limit (want at most %d)", queued, TCPMemory>>20, limit)
	}
	u, err := ur.Usage(in.Name)
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryBytes>>20 < queued {
		t.Fatalf("%d MiB held on TCP connections: the instance's usage says %d MiB", queued, u.MemoryBytes>>20)
	}
}
