package runtimetest

import (
	"bytes"
	"context"
	"strings"
	"time"

	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// LimitedPids and LimitedMemory are the limits Limits expects the instance
// to have.
const (
	LimitedPids   = 256
	LimitedMemory = 256 << 20
)

// Limits drives an instance with a pids limit of LimitedPids and a memory
// limit of LimitedMemory, and "sh" and "sleep" allowed, through a driver
// that reports usage: 1,500 background processes stop at the pids limit
// (the refused forks counted), a shell growing a string to 512 MiB is
// killed at the memory limit (the kill counted), and the instance still
// takes commands afterwards. Shell only, so that any image with a POSIX
// shell serves.
func Limits(t T, rt runtimes.Runtime, in runtimes.Instance) {
	t.Helper()
	ctx := context.Background()
	ur, ok := rt.(runtimes.UsageReader)
	if !ok {
		t.Fatalf("%T does not report usage", rt)
	}
	if in.Resources.Pids != LimitedPids || in.Resources.MemoryBytes != LimitedMemory {
		t.Fatalf("the instance's limits are %+v, want pids %d and memory %d", in.Resources, LimitedPids, LimitedMemory)
	}
	if _, err := rt.Ensure(ctx, in); err != nil {
		t.Fatal(err)
	}
	exec := func(script string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		st, err := rt.Exec(ctx, in.Name, runtimes.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return st.Code, out.String()
	}
	usage := func() runtimes.Usage {
		t.Helper()
		u, err := ur.Usage(in.Name)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}

	t.Log("a fork bomb stops at the pids limit")
	exec("i=0; while [ $i -lt 1500 ]; do sleep 8 & i=$((i+1)); done 2>/dev/null; exit 0")
	u := usage()
	if u.Pids > LimitedPids || u.PidsLimited == 0 {
		t.Fatalf("after 1,500 background processes: %d processes, %d forks refused (want at most %d, some refused)", u.Pids, u.PidsLimited, LimitedPids)
	}
	t.Log("processes:", u.Pids, "refused forks:", u.PidsLimited)
	for deadline := time.Now().Add(60 * time.Second); usage().Pids > 8; {
		if time.Now().After(deadline) {
			t.Fatalf("the background processes did not end: %+v", usage())
		}
		time.Sleep(250 * time.Millisecond)
	}

	t.Log("a memory hog is killed at the memory limit")
	before := usage().OOMKills
	code, out := exec("x=x; i=0; while [ $i -lt 29 ]; do x=$x$x; i=$((i+1)); done; echo grew ${#x}")
	if code == 0 || strings.Contains(out, "grew") {
		t.Fatalf("a shell grew a string to 512 MiB under a 256 MiB limit: exit %d, %q", code, out)
	}
	if u := usage(); u.OOMKills <= before {
		t.Fatalf("the kill at the memory limit is not counted: %+v (exit %d)", u, code)
	}

	if code, out := exec("echo alive"); code != 0 || out != "alive\n" {
		t.Fatalf("the instance after hitting its limits: exit %d, %q", code, out)
	}
}
