package bwrap_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// ensured returns a running bwrap instance for agent "ada" whose allowlist
// holds sh, over fresh areas.
func ensured(t *testing.T) (*bwrap.Runtime, runtimes.Instance, string) {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := t.TempDir()
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	spec := &v1alpha1.SandboxSpec{Agent: "ada", Binaries: []v1alpha1.BinaryName{"sh", "cat"}}
	in, err := instance.Standalone(spec, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	return rt, in, filepath.Join(dir, "areas", "ada")
}

func run(t *testing.T, rt *bwrap.Runtime, name string, argv ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := rt.Exec(context.Background(), name, runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return st.Code, out.String(), errb.String()
}

func TestCommandRunsInWorkspaceAndWritesReachTheHost(t *testing.T) {
	rt, in, agentDir := ensured(t)
	code, out, stderr := run(t, rt, in.Name, "sh", "-c", `pwd; echo "$HOME"; echo from-sandbox > written.txt`)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if got, want := out, "/workspace\n/workspace\n"; got != want {
		t.Fatalf("cwd and HOME: got %q, want %q", got, want)
	}
	b, err := os.ReadFile(filepath.Join(agentDir, "workspace", "written.txt"))
	if err != nil {
		t.Fatalf("the host does not see the file written in /workspace: %v", err)
	}
	if string(b) != "from-sandbox\n" {
		t.Fatalf("host sees %q", b)
	}
}

func TestBlocksAreReadOnly(t *testing.T) {
	rt, in, agentDir := ensured(t)
	if err := os.WriteFile(filepath.Join(agentDir, "blocks", "given.txt"), []byte("block"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, rt, in.Name, "sh", "-c", `cat /blocks/given.txt; echo x > /blocks/new.txt`)
	if code == 0 {
		t.Fatalf("writing to /blocks succeeded; it must be read-only")
	}
	if out != "block" || !strings.Contains(stderr, "Read-only file system") {
		t.Fatalf("want the block readable and the write refused as read-only; stdout %q stderr %q", out, stderr)
	}
	if _, err := os.Stat(filepath.Join(agentDir, "blocks", "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("a file appeared in the host blocks area: %v", err)
	}
}

func TestCommandNotInAllowlistRunsNothing(t *testing.T) {
	rt, in, _ := ensured(t)
	_, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"touch", "/workspace/x"}})
	if err == nil || runtimes.ReasonOf(err) != runtimes.ReasonRefused {
		t.Fatalf("want a CommandRefused error, got %v", err)
	}
}
