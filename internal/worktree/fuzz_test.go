package worktree_test

import (
	"errors"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/worktree"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// gitAccepts runs git check-ref-format with args and says whether git
// took the name.
func gitAccepts(t *testing.T, args ...string) bool {
	t.Helper()
	cmd := exec.Command("git", append([]string{"check-ref-format"}, args...)...)
	cmd.Env = []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=/nonexistent"}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return false
	}
	if err != nil {
		t.Fatalf("running git check-ref-format: %v", err)
	}
	return true
}

// FuzzWorktreeInputs holds what a tenant writes in spec.worktree (name,
// ref, repository) to what the controller may do with it: a name and a ref
// the rules accept are ones git takes as a branch name and a ref and that
// cannot read as an option; a repository they accept is a relative path
// without '.' or '..' segments; and the worktree's directory stays inside
// the repository's .worktrees. The seeds run as a normal test.
func FuzzWorktreeInputs(f *testing.F) {
	testenv.Binary(f, "git", "install git (hack/install-deps.sh)")
	for _, s := range [][3]string{
		{"s1", "main", "project/app"}, {"s1", "--checkout", "project"}, {"-b", "", "project"},
		{"a..b", "HEAD", "project"}, {"x.lock", "v1.0", "p"}, {"..", "a/../b", "../etc"},
		{"ok", "refs/heads/main", "/abs"}, {"ok", "@", "a//b"}, {"ok", "a@{1}", "a/./b"},
		{"name.", "feature/x", "project/app/"}, {".hidden", "main", "."}, {"a/b", "main", "p"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, name, ref, repository string) {
		if strings.IndexByte(name+ref, 0) >= 0 {
			return // argv cannot carry NUL; the rules refuse it anyway
		}
		spec := worktree.Spec{Name: name, Ref: ref}
		if worktree.CheckSpec(spec) == nil {
			if strings.HasPrefix(name, "-") || strings.HasPrefix(ref, "-") {
				t.Fatalf("accepted an option: name %q ref %q", name, ref)
			}
			if !gitAccepts(t, "--branch", name) {
				t.Fatalf("accepted name %q, which git refuses as a branch", name)
			}
			if ref != "" && !gitAccepts(t, "--allow-onelevel", ref) {
				t.Fatalf("accepted ref %q, which git check-ref-format refuses", ref)
			}
			if strings.ContainsAny(name, "/\\") {
				t.Fatalf("accepted name %q with a path separator", name)
			}
		}
		w := &v1alpha1.WorktreeSpec{Repository: repository, Name: "s1"}
		if len(v1alpha1.ValidateWorktree(w)) == 0 {
			clean := path.Clean(repository)
			if clean != repository || path.IsAbs(repository) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
				t.Fatalf("accepted repository %q (clean %q)", repository, clean)
			}
			if worktree.CheckSpec(spec) == nil {
				wt := filepath.Join("/mount", repository, worktree.Dir, name)
				if !strings.HasPrefix(wt, filepath.Join("/mount", repository, worktree.Dir)+"/") {
					t.Fatalf("worktree %q of name %q lies outside %s", wt, name, worktree.Dir)
				}
			}
		}
	})
}
