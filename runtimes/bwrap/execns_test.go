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
	"github.com/cireilclaw/sandbox-controller/internal/mountinfo"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// bubblewrap copies the mount namespace it starts in and reads its whole
// mount table again for every read-only bind. Started in the host's
// namespace, every command paid for every instance's tree on the host
// (with 5,000 tree mounts, 170 ms a start instead of 6). A command now
// starts in a namespace holding its own instance's tree and no other:
// what bubblewrap sees as it starts is recorded by a bubblewrap that
// prints its mount table first.
func TestACommandStartsWithoutTheOtherInstancesTrees(t *testing.T) {
	needTrees(t)
	real := testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	dir := testenv.SharedDir(t)
	wrapper := filepath.Join(dir, "bwrap-that-tells")
	script := "#!/bin/sh\ncat /proc/self/mountinfo >&2\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	rt, err := bwrap.New(bwrap.Config{StateDir: state, Bwrap: wrapper, Starter: testenv.Starter(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bwrap.DetachTrees(state); err != nil {
			t.Error(err)
		}
	})
	var ins []runtimes.Instance
	for _, agent := range []string{"ann", "bob"} {
		in, err := instance.Standalone(&v1alpha1.SandboxSpec{Agent: agent, Binaries: []v1alpha1.BinaryName{"true"}}, instance.Host{AreasRoot: filepath.Join(dir, "areas"), Home: dir})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Ensure(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
		ins = append(ins, in)
	}
	trees := bwrap.TreesDir(state)
	ann, bob := filepath.Join(trees, ins[0].Name), filepath.Join(trees, ins[1].Name)
	// Both trees are on the host.
	for _, tree := range []string{ann, bob} {
		if testenv.MountsBelow(t, tree) == 0 {
			t.Fatalf("no mount below %s on the host", tree)
		}
	}

	var stderr bytes.Buffer
	st, err := rt.Exec(context.Background(), ins[0].Name, runtimes.ExecRequest{Argv: []string{"true"}, Stderr: &stderr})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec: %v, exit %d: %s", err, st.Code, stderr.String())
	}
	var own, others int
	for _, line := range strings.Split(stderr.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := mountinfo.Unescape(f[4])
		switch {
		case strings.HasPrefix(p, ann+"/"):
			own++
		case p == filepath.Dir(trees):
			// The start namespace's own tmpfs holding ann's tree.
		case strings.HasPrefix(p, filepath.Dir(trees)+"/"):
			others++
			t.Errorf("bubblewrap started with %s mounted", p)
		}
	}
	if own == 0 {
		t.Fatalf("bubblewrap started without ann's tree:\n%s", stderr.String())
	}
	if others > 0 {
		t.Fatalf("bubblewrap started with %d mounts of trees other than ann's", others)
	}
}
