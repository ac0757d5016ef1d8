package mounttree

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// On the areas root an agent's areas sit in a directory only the agent may
// search; its tree reaches them past that directory, through directories
// every user may search (each agent's commands reach their own tree
// through them), and an area's own directory is open to all. A tree open
// to every user therefore let any user of the host read every agent's
// areas: the tree's directory is now root's and the agent's group's alone.
func TestATreeIsSearchableByItsAgentAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root", "mount trees are built only as root: run the tests as root (CI does)")
	}
	const agent, other = 2000000000, 2000000001
	dir := testenv.SharedDir(t)
	ws := filepath.Join(dir, "areas", "ada", "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(ws), 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(ws, "notes")
	if err := os.WriteFile(secret, []byte("the agent's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.GiveTo(t, agent, filepath.Dir(ws))
	tr := Tree{
		Dir:       filepath.Join(dir, "trees", "x", "cireilclaw-ada", "0"),
		Workspace: "workspace",
		Owner:     agent,
		Group:     agent,
		Areas:     []Area{{Name: "workspace", Source: areas.HostDir{Path: ws}}},
	}
	if err := os.MkdirAll(filepath.Dir(tr.Dir), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := tr.Build(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Remove(tr.Dir) })
	if err := tr.Verify(); err != nil {
		t.Fatalf("a tree just built does not verify: %v", err)
	}
	read := func(id uint32, path string) (string, error) {
		cmd := exec.Command("cat", path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	through := filepath.Join(tr.Dir, "workspace", "notes")
	if out, err := read(agent, through); err != nil {
		t.Fatalf("the agent cannot read its own area through its tree: %v: %s", err, out)
	}
	if _, err := read(other, secret); err == nil {
		t.Fatal("another user read the agent's area on the areas root: the test's premise does not hold")
	}
	if out, err := read(other, through); err == nil {
		t.Fatalf("another user of the host read the agent's area through its tree: %q", out)
	}
	// A tree built open to all, as before, is not kept.
	if err := os.Chmod(tr.Dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := tr.Verify(); err == nil {
		t.Fatal("a tree every user may search still verifies")
	}
}
