package execapi_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// aggregatedURL is the API server's URL of a claim's subresource.
func aggregatedURL(ns, claim, sub string) string {
	return fmt.Sprintf("%s%s/namespaces/%s/sessionclaims/%s/%s", strings.TrimSuffix(env.Config.Host, "/"), execapi.AggregatedPrefix, ns, claim, sub)
}

// execThrough runs argv in the claim through the API server with cfg's
// own credentials (a kubeconfig's), as kubectl sandbox exec does by default.
func execThrough(ctx context.Context, cfg *rest.Config, ns, claim string, argv ...string) result {
	q := url.Values{"command": argv, "stdout": {"true"}, "stderr": {"true"}}
	e, err := remotecommand.NewWebSocketExecutor(cfg, "GET", aggregatedURL(ns, claim, "exec")+"?"+q.Encode())
	Expect(err).NotTo(HaveOccurred())
	var out, errb lockedBuffer
	err = e.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	return result{stdout: out.String(), stderr: errb.String(), err: err}
}

// grantAggregated lets subject exec and use files of the claims of ns
// through both groups: the API server checks the aggregated group, the
// exec API sandbox.cireilclaw.dev.
// sandboxctlBinary builds sandboxctl once for the suite.
var sandboxctlBinary = sync.OnceValue(func() string {
	bin := filepath.Join(env.Dir, "bin", "sandboxctl")
	Expect(os.MkdirAll(filepath.Dir(bin), 0o755)).To(Succeed())
	build := osexec.Command("go", "build", "-o", bin, "./cmd/sandboxctl")
	build.Dir = filepath.Join(testenv.CRDDir(3), "..", "..", "..")
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
	return bin
})

func grantAggregated(ns string, subjects ...rbacv1.Subject) {
	Expect(env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-user-aggregated"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/exec"}, Verbs: []string{"create"}},
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims/files"}, Verbs: []string{"get", "update"}},
			// The node path reads the claim's status.endpoint; completion lists.
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{execapi.AggregatedGroup}, Resources: []string{"sessionclaims/exec"}, Verbs: []string{"get", "create"}},
			{APIGroups: []string{execapi.AggregatedGroup}, Resources: []string{"sessionclaims/files"}, Verbs: []string{"get", "update", "delete"}},
			{APIGroups: []string{execapi.AggregatedGroup}, Resources: []string{"sessionclaims/mcp"}, Verbs: []string{"get", "create"}},
		},
	})).To(Succeed())
	Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-user-aggregated"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sandbox-user-aggregated"},
		Subjects:   subjects,
	})).To(Succeed())
}

// requireNodeIP fails under CI and skips elsewhere when this machine has
// no address the API server proxies to.
func requireNodeIP() {
	if nodeIP == "" {
		testenv.Missing(GinkgoT(), "an IPv4 address of this machine that is not loopback", "the API server refuses loopback endpoints for an APIService's Service; bring up a network interface")
	}
}

var _ = Describe("the aggregated API through the API server", Ordered, func() {
	var (
		ns                 string
		alice, bob         *rest.Config // kubeconfig credentials for the API server
		aliceNode, bobNode *rest.Config // the same users' credentials for a node's exec API
	)
	const claim = "s1"

	BeforeAll(func() {
		requireNodeIP()
		installAggregatedAPI()
		routeTo(aggAPI)
		ns = env.NewNamespace()
		grantAggregated(ns, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"})
		for name, cfg := range map[string]**rest.Config{"alice": &alice, "bob": &bob} {
			u, err := testEnv.AddUser(envtest.User{Name: name, Groups: []string{"developers"}}, nil)
			Expect(err).NotTo(HaveOccurred())
			*cfg = u.Config()
		}
		aliceNode, bobNode = rest.CopyConfig(alice), rest.CopyConfig(bob)
		for _, c := range []*rest.Config{aliceNode, bobNode} {
			c.Host, c.CAData, c.CAFile = "https://"+hostNode.addr, aggCA.PEM, ""
		}
		Expect(env.Client.Create(ctx, &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "box"},
			Spec:       v1alpha1.SandboxSpec{Agent: "agg-" + ns, Binaries: []v1alpha1.BinaryName{"sh", "cat", "echo", "true"}},
		})).To(Succeed())
		Expect(env.Client.Create(ctx, testharness.NewClaim(ns, claim, "box"))).To(Succeed())
		Eventually(env.ClaimStatus(ns, claim), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
	})

	It("is discovered, and runs an allowed user's commands with the kubeconfig's own credentials", func() {
		res, err := kube.Discovery().ServerResourcesForGroupVersion(execapi.AggregatedGroup + "/" + execapi.AggregatedVersion)
		Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, r := range res.APIResources {
			names = append(names, r.Name)
		}
		Expect(names).To(ConsistOf("sessionclaims/exec", "sessionclaims/files", "sessionclaims/mcp"))

		// The manager's cache may not hold the claim's Ready status yet.
		Eventually(func() error { return execThrough(ctx, alice, ns, claim, "true").err }, timeout).Should(Succeed())
		r := execThrough(ctx, alice, ns, claim, "echo", "hello", "through", "the", "API", "server")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.stdout).To(Equal("hello through the API server\n"))
		r = execThrough(ctx, alice, ns, claim, "sh", "-c", "echo err >&2; exit 3")
		var code exec.CodeExitError
		Expect(errors.As(r.err, &code)).To(BeTrue(), "%v", r.err)
		Expect(code.Code).To(Equal(3))
		Expect(r.stderr).To(Equal("err\n"))
	})

	It("reads and writes files through the API server", func() {
		hc, err := rest.HTTPClientFor(alice)
		Expect(err).NotTo(HaveOccurred())
		do := func(method, body string) (int, string) {
			req, err := http.NewRequest(method, aggregatedURL(ns, claim, "files/workspace/note.txt"), strings.NewReader(body))
			Expect(err).NotTo(HaveOccurred())
			resp, err := hc.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			Expect(err).NotTo(HaveOccurred())
			return resp.StatusCode, string(b)
		}
		code, body := do(http.MethodPut, "written through the API server")
		Expect(code).To(BeNumerically("<", 300), body)
		code, body = do(http.MethodGet, "")
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(Equal("written through the API server"))
	})

	// kubeconfigOf writes a kubeconfig for user, with the API server's
	// address and CA and the user's client certificate.
	kubeconfigOf := func(user string) string {
		u, err := testEnv.AddUser(envtest.User{Name: user, Groups: []string{"developers"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		kc, err := u.KubeConfig()
		Expect(err).NotTo(HaveOccurred())
		kcFile := filepath.Join(env.Dir, user+"-"+ns+".kubeconfig")
		Expect(os.WriteFile(kcFile, kc, 0o600)).To(Succeed())
		return kcFile
	}
	// wrongCA verifies no node: only the API server path can work.
	wrongCA := func() string {
		f := filepath.Join(env.Dir, "wrong-ca-"+ns+".crt")
		Expect(os.WriteFile(f, servingCA, 0o600)).To(Succeed())
		return f
	}

	It("is what kubectl sandbox exec and cp use by default, with nothing but the kubeconfig", func() {
		bin := sandboxctlBinary()
		kcFile, wrongCA := kubeconfigOf("alice"), wrongCA()
		run := func(sub string, args ...string) (string, error) {
			cmd := osexec.Command(bin, append([]string{sub, "--kubeconfig", kcFile, "-n", ns, "--api-ca-file", wrongCA}, args...)...)
			b, err := cmd.CombinedOutput()
			return string(b), err
		}
		By("exec without --via: through the API server")
		got, err := run("exec", claim, "--", "echo", "via", "kubectl")
		Expect(err).NotTo(HaveOccurred(), got)
		Expect(got).To(Equal("via kubectl\n"))
		By("cp without --via: through the API server")
		local := filepath.Join(env.Dir, "cp-"+ns+".txt")
		Expect(os.WriteFile(local, []byte("copied through the API server"), 0o600)).To(Succeed())
		got, err = run("cp", local, claim+":/workspace/copied.txt")
		Expect(err).NotTo(HaveOccurred(), got)
		got, err = run("exec", "--via", "api-server", claim, "--", "cat", "/workspace/copied.txt")
		Expect(err).NotTo(HaveOccurred(), got)
		Expect(got).To(Equal("copied through the API server"))
		By("--via node goes to the node, whose certificate that CA does not verify")
		got, err = run("exec", "--via", "node", claim, "--", "true")
		Expect(err).To(HaveOccurred())
		Expect(got).To(ContainSubstring("certificate"))
	})

	It("serves kubectl sandbox as kubectl users expect: flags anywhere, help per verb, claims completed", func() {
		bin := sandboxctlBinary()
		plugin := filepath.Join(filepath.Dir(bin), "kubectl-sandbox")
		complete := filepath.Join(filepath.Dir(bin), "kubectl_complete-sandbox")
		for _, l := range []string{plugin, complete} {
			_ = os.Remove(l)
			Expect(os.Symlink(bin, l)).To(Succeed())
		}
		kcFile, wrongCA := kubeconfigOf("alice"), wrongCA()
		By("flags after the claim and after the paths")
		out, err := osexec.Command(plugin, "exec", claim, "-n", ns, "--kubeconfig", kcFile, "--api-ca-file", wrongCA, "--", "echo", "flags", "last").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(string(out)).To(Equal("flags last\n"))
		By("help for one verb, with examples, under the plugin's name")
		out, err = osexec.Command(plugin, "exec", "--help").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(string(out)).To(And(ContainSubstring("kubectl sandbox exec CLAIM"), ContainSubstring("Examples:"), ContainSubstring("--as-group"), ContainSubstring("--request-timeout")))
		By("kubectl's completion of the plugin lists the namespace's claims")
		out, err = osexec.Command(complete, "exec", "--kubeconfig", kcFile, "-n", ns, "").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(strings.Split(string(out), "\n")).To(ContainElement(claim))
		out, err = osexec.Command(complete, "cp", "notes.txt", "--kubeconfig", kcFile, "-n", ns, "s").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(strings.Split(string(out), "\n")).To(ContainElement(claim + ":"))
		By("a claim that is not there is not offered")
		out, err = osexec.Command(complete, "exec", "--kubeconfig", kcFile, "-n", ns, "zz").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(string(out)).NotTo(ContainSubstring(claim))
	})

	It("serves the claim's MCP tools through the API server to kubectl sandbox mcp, and to no one without the rights", func() {
		bin := sandboxctlBinary()
		mcpClient := func(user string) (*mcp.ClientSession, error) {
			cmd := osexec.Command(bin, "mcp", claim, "--kubeconfig", kubeconfigOf(user), "-n", ns, "--api-ca-file", wrongCA())
			cmd.Stderr = GinkgoWriter
			c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "v0"}, nil)
			return c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		}
		s, err := mcpClient("alice")
		Expect(err).NotTo(HaveOccurred())
		defer s.Close()
		tools, err := s.ListTools(ctx, nil)
		Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, t := range tools.Tools {
			names = append(names, t.Name)
			if t.Name == "exec" {
				Expect(t.Description).To(And(ContainSubstring("Allowed commands:"), ContainSubstring("echo"), ContainSubstring("cat")))
			}
		}
		Expect(names).To(ConsistOf("exec", "read_file", "write_file", "list_directory", "remove"))
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"argv": []string{"echo", "through", "the", "API", "server"}}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.IsError).To(BeFalse())
		Expect(res.StructuredContent).To(HaveKeyWithValue("stdout", "through the API server\n"))
		res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"argv": []string{"curl", "example.com"}}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.IsError).To(BeTrue(), "a command outside the allowlist is a tool error")
		res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": "/workspace/mcp.txt", "content": "by MCP\n"}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.IsError).To(BeFalse())
		res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "/workspace/mcp.txt"}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.StructuredContent).To(HaveKeyWithValue("content", "by MCP\n"))

		By("bob, without RBAC on the aggregated group, gets nothing")
		if s, err := mcpClient("bob"); err == nil {
			s.Close()
			Fail("bob connected to the claim's MCP tools")
		}
	})

	It("is refused by the API server for a user without RBAC on the aggregated group", func() {
		r := execThrough(ctx, bob, ns, claim, "true")
		Expect(r.err).To(MatchError(ContainSubstring(`cannot get resource "sessionclaims/exec" in API group "` + execapi.AggregatedGroup + `"`)))
	})

	It("never takes identity headers sent straight to a node as the user they name", func() {
		send := func(cfg *rest.Config, cert *tls.Certificate) (int, string) {
			tc := &tls.Config{RootCAs: pool(aggCA.PEM), MinVersion: tls.VersionTLS12}
			if cert != nil {
				tc.Certificates = []tls.Certificate{*cert}
			} else if cfg != nil {
				pair, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
				Expect(err).NotTo(HaveOccurred())
				tc.Certificates = []tls.Certificate{pair}
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 30 * time.Second}
			u := fmt.Sprintf("https://%s%s/namespaces/%s/sessionclaims/%s/exec?command=true", hostNode.addr, execapi.AggregatedPrefix, ns, claim)
			req, err := http.NewRequest(http.MethodGet, u, nil)
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("X-Remote-User", "alice")
			req.Header.Add("X-Remote-Group", "system:masters")
			resp, err := hc.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		By("without any certificate")
		code, body := send(nil, nil)
		Expect(code).To(Equal(http.StatusUnauthorized), body)
		By("with bob's own client certificate: bob, who may not exec")
		code, body = send(bobNode, nil)
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).To(ContainSubstring(`user \"bob\"`))
		By("with a certificate of the forwarder CA for a name other than the forwarder's")
		other, err := fwdCA.IssueClient("mallory", time.Hour, time.Now())
		Expect(err).NotTo(HaveOccurred())
		code, body = send(nil, other)
		Expect(code).To(Equal(http.StatusUnauthorized), body)
		By("with the forwarder's name signed by the exec API's CA, which every node holds: what a taken node could make")
		minted, err := aggCA.IssueClient(servingcert.ForwarderName, time.Hour, time.Now())
		Expect(err).NotTo(HaveOccurred())
		code, body = send(nil, minted)
		Expect(code).To(Equal(http.StatusUnauthorized), body)
		By("with the forwarder's certificate of the forwarder CA, which only the aggregated API holds, the headers name the user")
		fwd, err := fwdCA.IssueClient(servingcert.ForwarderName, time.Hour, time.Now())
		Expect(err).NotTo(HaveOccurred())
		code, body = send(nil, fwd)
		// alice is authorised; the plain GET lacks the websocket upgrade.
		Expect(code).To(Equal(http.StatusBadRequest), body)
		Expect(body).To(ContainSubstring("websocket"))
	})

	It("is served by the aggregated API, which runs nothing and forwards each request to the node of the claim's Sandbox", func() {
		By("a request straight to the aggregated API with the user's own credentials is misdirected, not forwarded")
		direct := rest.CopyConfig(aliceNode)
		direct.Host, direct.CAData = "https://"+aggAPI.addr, fwdCA.PEM
		direct.ServerName = aggServiceName + "." + aggServiceNS + ".svc"
		q := url.Values{"command": {"true"}}
		e, err := remotecommand.NewWebSocketExecutor(direct, "GET", fmt.Sprintf("https://%s/api/v1alpha1/namespaces/%s/sessionclaims/%s/exec?%s", aggAPI.addr, ns, claim, q.Encode()))
		Expect(err).NotTo(HaveOccurred())
		Expect(e.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard})).To(MatchError(ContainSubstring("this is the aggregated API, which runs nothing")))

		By("through the API server it is forwarded to the node, which runs it")
		before := hostNode.counter("sandbox_execapi_execs_total")
		forwarded := aggAPI.counter("sandbox_execapi_forwarded_total")
		r := execThrough(ctx, alice, ns, claim, "echo", "forwarded")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.stdout).To(Equal("forwarded\n"))
		Expect(aggAPI.counter("sandbox_execapi_forwarded_total")).To(BeNumerically(">", forwarded))
		Expect(aggAPI.counter("sandbox_execapi_execs_total")).To(BeZero(), "the aggregated API runs nothing")
		Expect(hostNode.counter("sandbox_execapi_execs_total")).To(BeNumerically(">", before), "the Sandbox's node ran it")
		r = execThrough(ctx, bob, ns, claim, "true")
		Expect(r.err).To(HaveOccurred(), "bob is still refused")

		By("a Sandbox whose node is lost is said to be not Ready, not forwarded to the endpoint it had")
		// Pinned to a node no controller here serves: the statuses are
		// written as its node and the placing node would have left them.
		pinnedElsewhere(ns, "lost", "node-c", reserveAddress(), // nothing listens there
			metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNodeLost, Message: "node node-c lost since a while"})
		r = execThrough(ctx, alice, ns, "lost-claim", "true")
		Expect(r.err).To(MatchError(And(ContainSubstring("is not Ready"), ContainSubstring("NodeLost"))))

		By("a claim pointed at another node's exec API is not forwarded there: the serving certificate must name the Sandbox's node")
		// As a taken node would write them: the claim of a Sandbox on
		// node-v points at this suite's node, whose certificate names
		// only its own address.
		pinnedElsewhere(ns, "posed", "node-v", hostNode.addr,
			metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunning, Message: "running"})
		before = hostNode.counter("sandbox_execapi_execs_total")
		r = execThrough(ctx, alice, ns, "posed-claim", "true")
		Expect(r.err).To(MatchError(And(ContainSubstring("certificate"), ContainSubstring("node-v"))))
		Expect(hostNode.counter("sandbox_execapi_execs_total")).To(Equal(before), "nothing reached the node that posed")

		By("kubectl sandbox exec --via node holds the endpoint's certificate to the Sandbox's node too, for a user who reads Sandboxes")
		Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-sandboxes"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"}, Verbs: []string{"get"}}}})).To(Succeed())
		Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-sandboxes"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-sandboxes"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}})).To(Succeed())
		caFile := filepath.Join(env.Dir, "node-ca-"+ns+".crt")
		Expect(os.WriteFile(caFile, aggCA.PEM, 0o600)).To(Succeed())
		out, err := osexec.Command(sandboxctlBinary(), "exec", "--kubeconfig", kubeconfigOf("alice"), "-n", ns, "--api-ca-file", caFile,
			"--via", "node", "posed-claim", "--", "true").CombinedOutput()
		Expect(err).To(HaveOccurred(), string(out))
		Expect(string(out)).To(And(ContainSubstring("certificate"), ContainSubstring("node-v")))
		Expect(hostNode.counter("sandbox_execapi_execs_total")).To(Equal(before), "nothing reached the node that posed")
	})

	It("forwards a request for a Sandbox placed on no node only when told that one node-less controller serves behind it", func() {
		// As the API server proxies a request: the front proxy's client
		// certificate, the user in headers.
		pair, err := tls.LoadX509KeyPair(filepath.Join(env.Dir, "front-proxy-client.crt"), filepath.Join(env.Dir, "front-proxy-client.key"))
		Expect(err).NotTo(HaveOccurred())
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool(fwdCA.PEM), ServerName: aggServiceName + "." + aggServiceNS + ".svc", Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}}}
		list := func(n *nodeAPI) (int, string) {
			req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://%s%s/namespaces/%s/sessionclaims/%s/files/workspace/", n.addr, execapi.AggregatedPrefix, ns, claim), nil)
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("X-Remote-User", "alice")
			req.Header.Set("X-Remote-Group", "developers")
			resp, err := hc.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		var sb v1alpha1.Sandbox
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "box"}, &sb)).To(Succeed())
		Expect(sb.Node()).To(BeEmpty(), "the suite's Sandbox is on no node")

		By("the aggregated API of a cluster: any node's controller can write the claim's endpoint, so nothing is forwarded")
		strict := startAggregatedAPI(reserveAddress(), mgr.Client, false)
		defer strict.Stop()
		code, body := list(strict)
		Expect(code).To(Equal(http.StatusConflict), body)
		Expect(body).To(ContainSubstring("placed on no node"))
		Expect(strict.counter("sandbox_execapi_forwarded_total")).To(BeZero())

		By("the suite's own, told so, forwards it to the endpoint")
		forwarded := aggAPI.counter("sandbox_execapi_forwarded_total")
		code, body = list(aggAPI)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(aggAPI.counter("sandbox_execapi_forwarded_total")).To(BeNumerically(">", forwarded))
	})
})

// pinnedElsewhere makes Sandbox name, pinned to node, which no controller
// of this suite serves, and its claim name-claim with the statuses that
// node would write: the Sandbox's Ready condition ready, and the claim
// bound at endpoint.
func pinnedElsewhere(ns, name, node, endpoint string, ready metav1.Condition) {
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.SandboxSpec{Agent: "agg-" + name + "-" + ns, NodeName: node, Binaries: []v1alpha1.BinaryName{"true"}},
	}
	Expect(env.Client.Create(ctx, sb)).To(Succeed())
	ready.LastTransitionTime = metav1.Now()
	sb.Status.Conditions = []metav1.Condition{ready}
	Expect(env.Client.Status().Update(ctx, sb)).To(Succeed())
	claim := testharness.NewClaim(ns, name+"-claim", name)
	Expect(env.Client.Create(ctx, claim)).To(Succeed())
	claim.Status.Endpoint = endpoint
	claim.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionBound, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBound,
		Message: "bound", LastTransitionTime: metav1.Now()}}
	Expect(env.Client.Status().Update(ctx, claim)).To(Succeed())
}
