package v1alpha1_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// refCases are refs the API server and the Go rule must both refuse, each
// with the rule it breaks; the first is the option injection of issue 13.
var refCases = []struct{ name, ref string }{
	{"option injection --checkout", "--checkout"},
	{"leading dash", "-b"},
	{"leading slash", "/main"},
	{"trailing slash", "main/"},
	{"trailing dot", "main."},
	{"double dot", "main..other"},
	{"double slash", "feature//x"},
	{"at brace", "main@{1}"},
	{"lone at", "@"},
	{"space", "main x"},
	{"tab", "main\tx"},
	{"newline", "main\nx"},
	{"DEL", "main\x7f"},
	{"tilde", "HEAD~1"},
	{"caret", "main^"},
	{"colon", "main:x"},
	{"question mark", "ma?n"},
	{"star", "ma*n"},
	{"open bracket", "ma[n"},
	{"backslash", `ma\in`},
	{"part starting with a dot", "feature/.hidden"},
	{"part ending in .lock", "feature.lock/x"},
	{"ending in .lock", "main.lock"},
}

var _ = Describe("SessionClaim worktree ref and name admission", func() {
	claim := func(ref, name string) *v1alpha1.SessionClaim {
		seq++
		return &v1alpha1.SessionClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ref-%d", seq), Namespace: "default"},
			Spec: v1alpha1.SessionClaimSpec{SandboxName: "a", Worktree: &v1alpha1.WorktreeSpec{
				Repository: "project", Ref: ref, Name: name,
			}},
		}
	}
	for _, tc := range refCases {
		It("refuses ref "+tc.name+" at admission and by the Go rule, with the same message", func() {
			err := k8s.Create(ctx, claim(tc.ref, ""))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(v1alpha1.MsgWorktreeRef))
			Expect(v1alpha1.ValidateWorktree(claim(tc.ref, "").Spec.Worktree).ToAggregate().Error()).To(ContainSubstring(v1alpha1.MsgWorktreeRef))
		})
	}
	DescribeTable("refuses a name git would not take as a branch, at admission and by the Go rule",
		func(name string) {
			err := k8s.Create(ctx, claim("", name))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(v1alpha1.MsgWorktreeNameRef))
			Expect(v1alpha1.ValidateWorktree(claim("", name).Spec.Worktree).ToAggregate().Error()).To(ContainSubstring(v1alpha1.MsgWorktreeNameRef))
		},
		Entry("double dot", "a..b"),
		Entry("trailing dot", "a."),
		Entry("ending in .lock", "s1.lock"),
	)
	DescribeTable("accepts ordinary refs and names",
		func(ref, name string) {
			Expect(k8s.Create(ctx, claim(ref, name))).To(Succeed())
			Expect(v1alpha1.ValidateWorktree(claim(ref, name).Spec.Worktree)).To(BeEmpty())
		},
		Entry("no ref", "", ""),
		Entry("branch", "main", "s1"),
		Entry("branch with slashes", "feature/login-form", "s2.v2"),
		Entry("tag", "v1.2.3", ""),
		Entry("commit", "0123456789abcdef0123456789abcdef01234567", ""),
		Entry("HEAD", "HEAD", ""),
		Entry("non-ASCII", "fonctionnalité", ""),
	)
})

// gitAcceptsRef asks git itself whether ref is a valid ref name
// (--allow-onelevel: "main" is one, as git worktree add takes it).
func gitAcceptsRef(t *testing.T, ref string) bool {
	t.Helper()
	err := exec.Command("git", "check-ref-format", "--allow-onelevel", ref).Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return false
	}
	if err != nil {
		t.Fatalf("running git check-ref-format: %v", err)
	}
	return true
}

// FuzzCheckWorktreeRef holds the Go rule to git's own: what the rule
// accepts git accepts, and what git accepts the rule accepts unless it
// starts with '-'. The seed corpus (every case above and some good refs)
// runs as a normal test; go test -fuzz FuzzCheckWorktreeRef explores more.
func FuzzCheckWorktreeRef(f *testing.F) {
	testenv.Binary(f, "git", "install git (hack/install-deps.sh)")
	for _, tc := range refCases {
		f.Add(tc.ref)
	}
	for _, s := range []string{"main", "feature/x", "v1.0", "a.b/c_d-e", "x@y", "@x", "a/@/b", "é", "a.lock.b", ".", "..", "a/.", "refs/heads/main"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		if ref == "" || strings.IndexByte(ref, 0) >= 0 {
			// "" means HEAD (no rule applies); argv cannot carry NUL, which the rule refuses.
			return
		}
		ours := v1alpha1.CheckWorktreeRef(ref) == ""
		git := gitAcceptsRef(t, ref)
		if ours && !git {
			t.Fatalf("the rule accepts %q, git check-ref-format refuses it", ref)
		}
		if git && !ours && !strings.HasPrefix(ref, "-") {
			t.Fatalf("git accepts %q and it does not start with '-', yet the rule refuses it", ref)
		}
	})
}
