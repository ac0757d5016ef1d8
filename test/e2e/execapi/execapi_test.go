package execapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/exectoken"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

type result struct {
	stdout, stderr string
	err            error
}

// execIn runs argv in the claim through the API as cfg's user.
func execIn(ctx context.Context, cfg *rest.Config, ns, claim string, stdin io.Reader, stdout io.Writer, argv ...string) result {
	q := url.Values{"command": argv, "stdout": {"true"}, "stderr": {"true"}}
	if stdin != nil {
		q.Set("stdin", "true")
	}
	u := fmt.Sprintf("%s/api/v1alpha1/namespaces/%s/sessionclaims/%s/exec?%s", apiHost, ns, claim, q.Encode())
	e, err := remotecommand.NewWebSocketExecutor(cfg, "GET", u)
	Expect(err).NotTo(HaveOccurred())
	// A cancelled stream returns while client-go may still be copying.
	var out, errb lockedBuffer
	if stdout == nil {
		stdout = &out
	}
	err = e.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: &errb})
	return result{stdout: out.String(), stderr: errb.String(), err: err}
}

// fileRequest sends one file request and returns the code and the body
// (the message, for a Status).
func fileRequest(cfg *rest.Config, method, ns, claim, p string, body io.Reader) (int, string) {
	return claimRequest(cfg, method, ns, claim, "files/"+p, body)
}

// claimRequest sends a plain HTTP request to a claim's endpoint.
func claimRequest(cfg *rest.Config, method, ns, claim, p string, body io.Reader) (int, string) {
	hc, err := rest.HTTPClientFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequest(method, fmt.Sprintf("%s/api/v1alpha1/namespaces/%s/sessionclaims/%s/%s", apiHost, ns, claim, p), body)
	Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	var st metav1.Status
	if json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
		return resp.StatusCode, st.Message
	}
	return resp.StatusCode, string(b)
}

// sleepRunning reports whether a process on the host runs sleep <marker>
// (the sandboxed sleep, or bwrap's command line ending with it).
func sleepRunning(marker string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasSuffix(string(b), "sleep\x00"+marker+"\x00") {
			return true
		}
	}
	return false
}

type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

var _ = Describe("the exec and file API", Ordered, func() {
	var (
		ns, roDir, outside string
		alice, bob, agent  *rest.Config
		// aliceKube is alice's kubeconfig for the API server itself.
		aliceKube *rest.Config
		// plainToken is the agent's token for the API server itself.
		plainToken string
	)
	const claim = "s1"

	BeforeAll(func() {
		ns = env.NewNamespace()
		roDir = filepath.Join(env.Dir, "ro-"+ns)
		outside = filepath.Join(env.Dir, "outside-"+ns)
		for _, d := range []string{roDir, outside} {
			Expect(os.MkdirAll(d, 0o755)).To(Succeed())
		}
		Expect(os.WriteFile(filepath.Join(roDir, "readme"), []byte("read only"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)).To(Succeed())

		By("granting exec and files to alice and the agent service account, files read-only to bob")
		Expect(env.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-user"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/exec"}, Verbs: []string{"create"}},
				{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/files"}, Verbs: []string{"get", "update"}},
			},
		})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/files"}, Verbs: []string{"get"}}},
		})).To(Succeed())
		Expect(env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"}})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-user"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sandbox-user"},
			Subjects: []rbacv1.Subject{
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"},
				{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "agent"},
			},
		})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sandbox-reader"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "bob"}},
		})).To(Succeed())

		for name, cfg := range map[string]**rest.Config{"alice": &alice, "bob": &bob} {
			u, err := testEnv.AddUser(envtest.User{Name: name, Groups: []string{"developers"}}, nil)
			Expect(err).NotTo(HaveOccurred())
			*cfg = apiConfig(u.Config())
			if name == "alice" {
				aliceKube = u.Config()
			}
		}
		tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences: []string{execapi.DefaultAudience}, ExpirationSeconds: ptr.To[int64](600),
		}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		agent = apiConfig(&rest.Config{BearerToken: tok.Status.Token})
		tok, err = kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		plainToken = tok.Status.Token
		By("letting the agent service account request its own tokens, as kubectl sandbox does")
		Expect(env.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "own-token"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"agent"}, Verbs: []string{"create"}}},
		})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "own-token"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "own-token"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "agent"}},
		})).To(Succeed())

		By("making a Sandbox with a read-only mount and a claim, and waiting until it is Ready")
		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "box"},
			Spec: v1alpha1.SandboxSpec{
				Agent:    "ada-" + ns,
				Binaries: []v1alpha1.BinaryName{"sh", "cat", "head", "sleep", "true"},
				Mounts:   []v1alpha1.Mount{{Source: roDir, Target: "docs", Mode: v1alpha1.MountReadOnly}},
			},
		}
		Expect(env.Client.Create(ctx, sb)).To(Succeed())
		Expect(env.Client.Create(ctx, testharness.NewClaim(ns, claim, "box"))).To(Succeed())
		Eventually(env.ClaimStatus(ns, claim), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
	})

	// The benchmark joins the suite only when SANDBOX_BENCH_OUT names the
	// page its table goes into (make bench-execapi).
	if out := testenv.BenchOut(); out != "" {
		It("measures exec of true through the API against the runtime called directly", Label("bench"), func() {
			// Through the API server too when this machine has an address
			// it may proxy to (the row is left out without one, and CI fails).
			var kube *rest.Config
			switch {
			case nodeIP != "":
				grantAggregated(ns, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"})
				kube = aliceKube
			case testenv.InCI():
				requireNodeIP()
			}
			benchmarkExec(out, alice, kube, ns, claim, v1alpha1.InstanceName("ada-"+ns))
		})
	}

	Describe("exec", func() {
		It("gives an allowed user stdout, stderr and the exit code", func() {
			res := execIn(ctx, alice, ns, claim, nil, nil, "sh", "-c", "echo out; echo err >&2; exit 3")
			var code exec.CodeExitError
			Expect(errors.As(res.err, &code)).To(BeTrue(), "error %v", res.err)
			Expect(code.Code).To(Equal(3))
			Expect(res.stdout).To(Equal("out\n"))
			Expect(res.stderr).To(Equal("err\n"))
		})

		It("passes stdin to the command", func() {
			res := execIn(ctx, alice, ns, claim, strings.NewReader("through stdin\n"), nil, "cat")
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.stdout).To(Equal("through stdin\n"))
		})

		It("lets a service account token in when its RBAC allows it", func() {
			res := execIn(ctx, agent, ns, claim, nil, nil, "sh", "-c", "echo agent")
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.stdout).To(Equal("agent\n"))
		})

		It("refuses a token issued for the API server with 401, saying how to get one", func() {
			plain := apiConfig(&rest.Config{BearerToken: plainToken})
			res := execIn(ctx, plain, ns, claim, nil, nil, "sh", "-c", "echo no")
			Expect(res.err).To(MatchError(ContainSubstring(`the exec API accepts only tokens issued for audience "` + execapi.DefaultAudience + `"`)))
			Expect(res.err).To(MatchError(ContainSubstring("kubectl create token SERVICE_ACCOUNT --audience " + execapi.DefaultAudience)))
			code, msg := fileRequest(plain, "GET", ns, claim, "workspace", nil)
			Expect(code).To(Equal(http.StatusUnauthorized), msg)

			By("while the API server itself still takes the token")
			sa := kubernetes.NewForConfigOrDie(&rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: plainToken})
			_, err := sa.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
		})

		It("refuses a token valid for the exec API and for the API server both, which a node could use there", func() {
			apiAud, isJWT := kubeauth.Audiences(plainToken)
			Expect(isJWT).To(BeTrue())
			tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
				Audiences: append([]string{execapi.DefaultAudience}, apiAud...), ExpirationSeconds: ptr.To[int64](600),
			}}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			both := tok.Status.Token
			By("the API server takes it")
			sa := kubernetes.NewForConfigOrDie(&rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: both})
			_, err = sa.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			By("a node does not, and says why")
			res := execIn(ctx, apiConfig(&rest.Config{BearerToken: both}), ns, claim, nil, nil, "sh", "-c", "echo no")
			Expect(res.err).To(MatchError(ContainSubstring(`the token is issued for 2 audiences, not for "` + execapi.DefaultAudience + `" alone`)))
			By("and kubectl sandbox exchanges it for one of the exec API's alone")
			kubeconfig := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: both}
			cfg, err := exectoken.ForExecAPI(ctx, kubeconfig, execapi.DefaultAudience, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(cfg.BearerToken).NotTo(Equal(both))
			aud, _ := kubeauth.Audiences(cfg.BearerToken)
			Expect(aud).To(Equal([]string{execapi.DefaultAudience}))
			res = execIn(ctx, apiConfig(cfg), ns, claim, nil, nil, "sh", "-c", "echo exchanged")
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.stdout).To(Equal("exchanged\n"))
		})

		It("refuses an exec API token at the API server", func() {
			sa := kubernetes.NewForConfigOrDie(&rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: agent.BearerToken})
			_, err := sa.CoreV1().ServiceAccounts(ns).Get(ctx, "agent", metav1.GetOptions{})
			Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "the API server answered %v", err)
		})

		It("gives kubectl sandbox, with a service account kubeconfig, a token for the exec API only", func() {
			kubeconfig := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: plainToken}
			cfg, err := exectoken.ForExecAPI(ctx, kubeconfig, execapi.DefaultAudience, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(cfg.BearerToken).NotTo(BeEmpty())
			Expect(cfg.BearerToken).NotTo(Equal(plainToken))
			res := execIn(ctx, apiConfig(cfg), ns, claim, nil, nil, "sh", "-c", "echo exchanged")
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.stdout).To(Equal("exchanged\n"))

			By("and keeps a client certificate as it is, sending no token")
			u, err := testEnv.AddUser(envtest.User{Name: "alice", Groups: []string{"developers"}}, nil)
			Expect(err).NotTo(HaveOccurred())
			withToken := u.Config()
			withToken.BearerToken = plainToken
			cfg, err = exectoken.ForExecAPI(ctx, withToken, execapi.DefaultAudience, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(cfg.BearerToken).To(BeEmpty())
			res = execIn(ctx, apiConfig(cfg), ns, claim, nil, nil, "sh", "-c", "echo certificate")
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.stdout).To(Equal("certificate\n"))
		})

		It("answers 403 to a user without sessionclaims/exec", func() {
			res := execIn(ctx, bob, ns, claim, nil, nil, "sh", "-c", "echo no")
			Expect(res.err).To(MatchError(ContainSubstring(`user "bob" cannot create resource "sessionclaims/exec"`)))
			code, msg := claimRequest(bob, "POST", ns, claim, "exec?command=sh", nil)
			Expect(code).To(Equal(http.StatusForbidden), msg)
		})

		It("answers 401 to a request without credentials", func() {
			res := execIn(ctx, apiConfig(nil), ns, claim, nil, nil, "sh", "-c", "echo no")
			Expect(res.err).To(MatchError(ContainSubstring("anonymous requests are refused")))
			code, msg := claimRequest(apiConfig(nil), "POST", ns, claim, "exec?command=sh", nil)
			Expect(code).To(Equal(http.StatusUnauthorized), msg)
		})

		DescribeTable("refuses commands the policy refuses, and runs nothing",
			func(argv []string, want string) {
				res := execIn(ctx, alice, ns, claim, nil, nil, argv...)
				Expect(res.err).To(MatchError(ContainSubstring(want)))
				Expect(res.stdout).To(BeEmpty())
			},
			Entry("not on the allowlist", []string{"touch", "/workspace/ran"}, `command refused: command "touch" is not in the sandbox's binaries allowlist`),
			Entry("a shell metacharacter", []string{"sh;touch", "/workspace/ran"}, "command refused"),
		)

		It("kills the process when the client cancels", func() {
			marker := fmt.Sprint(3000 + GinkgoRandomSeed()%1000)
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan result, 1)
			go func() { done <- execIn(cctx, alice, ns, claim, nil, nil, "sleep", marker) }()
			Eventually(func() bool { return sleepRunning(marker) }, timeout).Should(BeTrue())
			cancel()
			Eventually(func() bool { return sleepRunning(marker) }, timeout).Should(BeFalse())
			Eventually(done, timeout).Should(Receive())
		})

		It("answers a failure of the runtime with its reason and an id, naming no host path", func() {
			By("making a Sandbox of its own, whose instance record is then damaged")
			Expect(env.Client.Create(ctx, &v1alpha1.Sandbox{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "damaged"},
				Spec:       v1alpha1.SandboxSpec{Agent: "dora-" + ns, Binaries: []v1alpha1.BinaryName{"true"}},
			})).To(Succeed())
			Expect(env.Client.Create(ctx, testharness.NewClaim(ns, "d1", "damaged"))).To(Succeed())
			Eventually(env.ClaimStatus(ns, "d1"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
			record := filepath.Join(env.Dir, "bwrap", v1alpha1.InstanceName("dora-"+ns)+".json")
			kept, err := os.ReadFile(record)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() {
				Expect(os.WriteFile(record, kept, 0o600)).To(Succeed())
				for _, o := range []client.Object{testharness.NewClaim(ns, "d1", "damaged"),
					&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "damaged"}}} {
					env.DeleteAndWait(o)
				}
			})
			Expect(os.WriteFile(record, []byte("{damaged"), 0o600)).To(Succeed())

			res := execIn(ctx, alice, ns, "d1", nil, nil, "true")
			Expect(res.err).To(HaveOccurred())
			// The runtime's own words name the record's host path.
			Expect(res.err.Error()).NotTo(ContainSubstring(env.Dir), "the answer names a host path")
			Expect(res.err.Error()).To(MatchRegexp(`running the command failed \(RuntimeError\); the node's log has why, under failure [0-9a-f]{12}`))
		})

		It("streams a large output without holding it in memory", func() {
			const size = 50 << 20
			old := debug.SetGCPercent(10)
			defer debug.SetGCPercent(old)
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			base := ms.HeapAlloc
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				t := time.NewTicker(5 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						var m runtime.MemStats
						runtime.ReadMemStats(&m)
						if m.HeapAlloc > peak.Load() {
							peak.Store(m.HeapAlloc)
						}
					}
				}
			}()
			var out countingWriter
			res := execIn(ctx, alice, ns, claim, nil, &out, "head", "-c", fmt.Sprint(size), "/dev/zero")
			close(stop)
			<-sampled
			Expect(res.err).NotTo(HaveOccurred())
			Expect(out.n.Load()).To(BeEquivalentTo(size))
			growth := int64(peak.Load()) - int64(base)
			GinkgoWriter.Printf("heap growth while streaming %d MiB: %.1f MiB\n", size>>20, float64(growth)/(1<<20))
			Expect(growth).To(BeNumerically("<", 16<<20), "the heap grew by %d bytes while streaming %d", growth, size)
		})
	})

	Describe("files", func() {
		It("writes, reads, lists and deletes", func() {
			code, msg := fileRequest(alice, "PUT", ns, claim, "workspace/notes?directory=true", nil)
			Expect(code).To(Equal(http.StatusCreated), msg)
			code, msg = fileRequest(alice, "PUT", ns, claim, "workspace/notes/a.txt", strings.NewReader("hello"))
			Expect(code).To(Equal(http.StatusNoContent), msg)
			code, body := fileRequest(bob, "GET", ns, claim, "workspace/notes/a.txt", nil)
			Expect(code).To(Equal(http.StatusOK))
			Expect(body).To(Equal("hello"))

			By("seeing the file from inside the sandbox")
			res := execIn(ctx, alice, ns, claim, nil, nil, "cat", "/workspace/notes/a.txt")
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.stdout).To(Equal("hello"))

			code, body = fileRequest(alice, "GET", ns, claim, "workspace/notes", nil)
			Expect(code).To(Equal(http.StatusOK))
			var entries []struct {
				Name string `json:"name"`
				Type string `json:"type"`
				Size int64  `json:"size"`
			}
			Expect(json.Unmarshal([]byte(body), &entries)).To(Succeed())
			Expect(entries).To(ConsistOf(HaveField("Name", "a.txt")))
			Expect(entries[0].Size).To(BeEquivalentTo(5))

			code, msg = fileRequest(alice, "DELETE", ns, claim, "workspace/notes/a.txt", nil)
			Expect(code).To(Equal(http.StatusNoContent), msg)
			code, _ = fileRequest(alice, "HEAD", ns, claim, "workspace/notes/a.txt", nil)
			Expect(code).To(Equal(http.StatusNotFound))
		})

		DescribeTable("refuses",
			func(cfg func() *rest.Config, method, p string, code int, want string) {
				got, msg := fileRequest(cfg(), method, ns, claim, p, strings.NewReader("x"))
				Expect(got).To(Equal(code), msg)
				Expect(msg).To(ContainSubstring(want))
			},
			Entry("writes to /blocks", func() *rest.Config { return alice }, "PUT", "blocks/x", http.StatusForbidden, "read-only"),
			Entry("writes to a read-only mount", func() *rest.Config { return alice }, "PUT", "workspace/docs/readme", http.StatusForbidden, "read-only"),
			Entry("deletes in a read-only mount", func() *rest.Config { return alice }, "DELETE", "workspace/docs/readme", http.StatusForbidden, "read-only"),
			Entry("writes without sessionclaims/files update", func() *rest.Config { return bob }, "PUT", "workspace/b.txt", http.StatusForbidden, `cannot update resource "sessionclaims/files"`),
			Entry("requests without credentials", func() *rest.Config { return apiConfig(nil) }, "GET", "workspace", http.StatusUnauthorized, "anonymous"),
		)

		It("refuses a symbolic link that escapes its area", func() {
			ws := filepath.Join(env.AreasRoot, "ada-"+ns, "workspace")
			Expect(os.Symlink(outside, filepath.Join(ws, "out"))).To(Succeed())
			for _, m := range []string{"GET", "PUT"} {
				code, msg := fileRequest(alice, m, ns, claim, "workspace/out/secret", strings.NewReader("overwritten"))
				Expect(code).To(Equal(http.StatusForbidden), msg)
				Expect(msg).To(ContainSubstring("escapes"))
			}
			Expect(os.ReadFile(filepath.Join(outside, "secret"))).To(BeEquivalentTo("secret"))
		})
	})

	Describe("certificates without manual steps", func() {
		It("serves with a certificate from the cluster's CA, which every user can read and only the controller can sign with, renewed before it expires", func() {
			const sys = servingcert.DefaultNamespace
			By("installing the namespace and the CA reader role of config/rbac")
			Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sys}})).To(Or(Succeed(), Satisfy(apierrors.IsAlreadyExists)))
			applyYAML(filepath.Join(testenv.CRDDir(3), "..", "..", "rbac", "ca_reader.yaml"))

			By("starting four node controllers' certificate sources at once: one CA is made")
			sources := make([]*servingcert.Source, 4)
			var wg sync.WaitGroup
			for i := range sources {
				sources[i] = &servingcert.Source{Client: env.Client, Namespace: sys, Hosts: []string{"127.0.0.1", fmt.Sprintf("node-%d", i)},
					Validity: 3 * time.Second, Log: logf.Log.WithName("servingcert")}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer GinkgoRecover()
					Expect(sources[i].Load(ctx)).To(Succeed())
				}()
			}
			wg.Wait()
			issuers := map[string]bool{}
			for _, s := range sources {
				c, err := s.GetCertificate(nil)
				Expect(err).NotTo(HaveOccurred())
				issuers[string(c.Leaf.RawIssuer)+string(c.Leaf.AuthorityKeyId)] = true
			}
			Expect(issuers).To(HaveLen(1), "every node's certificate is signed by the same CA")

			By("reading the CA as alice, who holds no role in that namespace but the reader's")
			aliceAPI := rest.CopyConfig(alice)
			aliceAPI.Host, aliceAPI.CAData = env.Config.Host, env.Config.CAData
			aliceClient, err := client.New(aliceAPI, client.Options{})
			Expect(err).NotTo(HaveOccurred())
			caPEM, found, err := servingcert.ExecAPICA.ReadPublished(ctx, aliceClient, sys)
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeTrue())
			var secret corev1.Secret
			Expect(apierrors.IsForbidden(aliceClient.Get(ctx, client.ObjectKey{Namespace: sys, Name: servingcert.SecretName}, &secret))).To(BeTrue(),
				"the CA's key is not readable by users")

			By("serving the exec API with the first source and verifying it with the published CA alone")
			src := sources[0]
			runCtx, stopRenewal := context.WithCancel(ctx)
			defer stopRenewal()
			go func() { _ = src.Start(runCtx) }()
			host, restore := serveInstead(env.Client, time.Millisecond, src.GetCertificate)
			defer restore()
			cfg := rest.CopyConfig(alice)
			cfg.CAData, cfg.CAFile = caPEM, ""
			Expect(execIn(ctx, cfg, ns, claim, nil, nil, "true").err).NotTo(HaveOccurred())

			serial := func() (string, error) {
				conn, err := tls.Dial("tcp", strings.TrimPrefix(host, "https://"), &tls.Config{RootCAs: pool(caPEM), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
				if err != nil {
					return "", err
				}
				defer conn.Close()
				return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
			}
			first, err := serial()
			Expect(err).NotTo(HaveOccurred())
			Eventually(serial, 10*time.Second, 200*time.Millisecond).ShouldNot(Equal(first), "renewed at two thirds of its 3s life")
			Expect(execIn(ctx, cfg, ns, claim, nil, nil, "true").err).NotTo(HaveOccurred(), "the renewed certificate verifies too")

			By("refusing a client that trusts another CA")
			other := rest.CopyConfig(alice)
			other.CAData = servingCA
			Expect(execIn(ctx, other, ns, claim, nil, nil, "true").err).To(MatchError(ContainSubstring("certificate")))
		})
	})
})

var _ = Describe("namespaces never share an agent", func() {
	It("refuses exec and files on a Sandbox whose agent another namespace owns, with 409, and leaves that namespace's data alone", func() {
		nsA, nsB := env.NewNamespace(), env.NewNamespace()
		agentName := "shared-" + nsA
		By("giving mallory exec and files in namespace b only")
		Expect(env.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "sandbox-user"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/exec"}, Verbs: []string{"create"}},
				{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/files"}, Verbs: []string{"get", "update"}},
			},
		})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "sandbox-user"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sandbox-user"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "mallory"}},
		})).To(Succeed())
		u, err := testEnv.AddUser(envtest.User{Name: "mallory"}, nil)
		Expect(err).NotTo(HaveOccurred())
		mallory := apiConfig(u.Config())

		sandbox := func(ns string) *v1alpha1.Sandbox {
			return &v1alpha1.Sandbox{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alice"},
				Spec:       v1alpha1.SandboxSpec{Agent: agentName, Binaries: []v1alpha1.BinaryName{"sh", "cat"}},
			}
		}
		Expect(env.Client.Create(ctx, sandbox(nsA))).To(Succeed())
		Expect(env.Client.Create(ctx, testharness.NewClaim(nsA, "a", "alice"))).To(Succeed())
		Eventually(env.ClaimStatus(nsA, "a"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		plan := filepath.Join(env.AreasRoot, agentName, "workspace", "plan.txt")
		Expect(os.WriteFile(plan, []byte("namespace a's plan"), 0o644)).To(Succeed())

		// Creation timestamps have whole-second resolution.
		time.Sleep(1100 * time.Millisecond)
		Expect(env.Client.Create(ctx, sandbox(nsB))).To(Succeed())
		Expect(env.Client.Create(ctx, testharness.NewClaim(nsB, "b", "alice"))).To(Succeed())
		Eventually(env.ClaimStatus(nsB, "b"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionBound, metav1.ConditionFalse, v1alpha1.ReasonNameConflict)))

		want := fmt.Sprintf("Sandbox %s/alice already uses agent %q", nsA, agentName)
		res := execIn(ctx, mallory, nsB, "b", nil, nil, "cat", "/workspace/plan.txt")
		Expect(res.err).To(MatchError(ContainSubstring(want)))
		Expect(res.stdout).To(BeEmpty())
		for _, m := range []string{"GET", "PUT", "DELETE"} {
			code, msg := fileRequest(mallory, m, nsB, "b", "workspace/plan.txt", strings.NewReader("overwritten"))
			Expect(code).To(Equal(http.StatusConflict), "%s: %s", m, msg)
			Expect(msg).To(ContainSubstring(want))
			Expect(msg).NotTo(ContainSubstring("namespace a's plan"))
		}
		By("answering the exec upgrade itself with 409")
		hc, err := rest.HTTPClientFor(mallory)
		Expect(err).NotTo(HaveOccurred())
		req, err := http.NewRequest("GET", fmt.Sprintf("%s/api/v1alpha1/namespaces/%s/sessionclaims/b/exec?command=cat&stdout=true", apiHost, nsB), nil)
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		req.Header.Set("Sec-WebSocket-Protocol", "v5.channel.k8s.io")
		resp, err := hc.Do(req)
		Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusConflict), string(body))
		var st metav1.Status
		Expect(json.Unmarshal(body, &st)).To(Succeed())
		Expect(st.Message).To(ContainSubstring(want))
		Expect(os.ReadFile(plan)).To(BeEquivalentTo("namespace a's plan"))
	})
})

// lockedBuffer is a buffer safe to read while client-go still writes to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func pool(pemCerts []byte) *x509.CertPool {
	p := x509.NewCertPool()
	Expect(p.AppendCertsFromPEM(pemCerts)).To(BeTrue())
	return p
}

// applyYAML creates the objects of a manifest as an administrator would.
func applyYAML(path string) {
	b, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return
		} else {
			Expect(err).NotTo(HaveOccurred())
		}
		if len(u.Object) == 0 {
			continue
		}
		Expect(env.Client.Create(ctx, &u)).To(Or(Succeed(), Satisfy(apierrors.IsAlreadyExists)))
	}
}
