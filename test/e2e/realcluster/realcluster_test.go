//go:build realcluster

// Package realcluster_test runs the project as a user would on a real
// cluster (hack/cluster.sh: a kubelet, kube-proxy and a CRI containerd, so
// the DaemonSet's pod really starts and its sandboxes really run): it builds
// the image, imports it into the node's containerd, runs make deploy, applies
// the samples, waits for the claim, runs `kubectl sandbox exec` through the
// API server (the aggregated API) and on the node, places Sandboxes on a
// second node (a second controller process) and moves one off it when that
// node is lost, follows the README's worktree example, runs a containerd
// Sandbox on the node's containerd, deletes everything, runs make undeploy
// and checks that nothing is left but the agents' areas on the node.
//
// `make test-cluster` starts the cluster, runs this package with its
// KUBECONFIG, KUBECTL and CLUSTER_CONTAINERD_ADDRESS (hack/cluster.sh env)
// and stops the cluster after. It changes the cluster (the deployment is
// removed at the end) and the node's /var/lib/sandbox-controller, so it runs
// only when built with the realcluster tag, which make test-cluster sets:
// `go test ./...` (make test) never builds it, so never deploys to whatever
// cluster a developer's KUBECONFIG names. Asked to run without a cluster's variables,
// it skips, or fails under CI=true.
package realcluster_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const (
	namespace = "sandbox-controller-system"
	// version tags the image this suite builds and deploys.
	version = "test-cluster"
	// imageRef is the name make image gives it and the kubelet looks up for
	// sandbox-controller:VERSION.
	imageRef = "docker.io/library/sandbox-controller:" + version
	// areas is the DaemonSet's hostPath for the agents' areas.
	areas     = "/var/lib/sandbox-controller"
	wtClaim   = "bob-fix-login"
	wtInside  = "/workspace/demo/app/.worktrees/" + wtClaim
	sampleCl  = "alice-session-1"
	sampleSbx = "alice"
)

var (
	repo       string
	kubectl    string
	ctr        string
	ctrAddress string
	pluginDir  string // holds kubectl-sandbox, put first on PATH
	scratch    string
	// The README's worktree example: a host directory holding a
	// repository, mounted into the controller's pod as docs/cluster.md
	// (Custom mounts) says.
	demoDir  string
	demoRepo string
	// sampleNode is where the scheduler put the sample Sandbox.
	sampleNode string
	// placed is where the spread put its Sandboxes.
	placed map[string]string
)

func TestRealCluster(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Real cluster suite")
}

var _ = BeforeSuite(func() {
	for _, v := range []string{"KUBECONFIG", "CLUSTER_CONTAINERD_ADDRESS"} {
		if os.Getenv(v) == "" {
			testenv.Missing(GinkgoT(), v, "run `make test-cluster`, or start a cluster with hack/cluster.sh start and eval \"$(hack/cluster.sh env)\"")
		}
	}
	testenv.Binary(GinkgoT(), "make", "install make (apt-get install make)")
	testenv.Binary(GinkgoT(), "git", "install git (apt-get install git)")
	var err error
	repo, err = filepath.Abs(filepath.Join("..", "..", ".."))
	Expect(err).NotTo(HaveOccurred())
	kubectl = os.Getenv("KUBECTL")
	if kubectl == "" {
		assets, cancel := testenv.Command(20*time.Minute, filepath.Join(repo, "hack", "envtest-assets.sh"), "--print-dir")
		out, err := assets.Output()
		cancel()
		Expect(err).NotTo(HaveOccurred())
		kubectl = filepath.Join(strings.TrimSpace(string(out)), "kubectl")
	}
	if _, err := os.Stat(kubectl); err != nil {
		testenv.Missing(GinkgoT(), "kubectl", "hack/cluster.sh env names it (KUBECTL)")
	}
	ctr = filepath.Join(repo, "bin", "containerd", "ctr")
	if _, err := os.Stat(ctr); err != nil {
		testenv.Missing(GinkgoT(), "ctr", "hack/containerd.sh build (hack/cluster.sh start builds it)")
	}
	ctrAddress = os.Getenv("CLUSTER_CONTAINERD_ADDRESS")
	out, err := run(time.Minute, kubectl, "get", "--raw", "/readyz")
	Expect(err).NotTo(HaveOccurred(), "the cluster of KUBECONFIG does not answer: %s", out)

	scratch, err = os.MkdirTemp("", "realcluster-")
	Expect(err).NotTo(HaveOccurred())
	// The plugin as a user installs it: kubectl-sandbox on PATH.
	pluginDir = filepath.Join(scratch, "bin")
	build, cancelBuild := testenv.Command(10*time.Minute, "go", "build", "-o", filepath.Join(pluginDir, "kubectl-sandbox"), "./cmd/sandboxctl")
	defer cancelBuild()
	build.Dir = repo
	b, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "building the plugin: %s", b)
})

var _ = AfterSuite(func() {
	if scratch != "" {
		Expect(os.RemoveAll(scratch)).To(Succeed())
	}
})

// run runs a command with PATH starting at the plugin's directory and
// returns its combined output; its process group is killed after timeout.
func run(timeout time.Duration, name string, args ...string) (string, error) {
	cmd, cancel := testenv.Command(timeout, name, args...)
	defer cancel()
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ %s %s  (%s)\n%s\n", filepath.Base(name), strings.Join(args, " "), time.Since(t0).Round(time.Millisecond), out)
	return string(out), err
}

func kc(args ...string) string {
	out, err := run(3*time.Minute, kubectl, args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "kubectl %s: %s", strings.Join(args, " "), out)
	return out
}

// rolledOut waits for a workload of the deployment to be rolled out and,
// when it is not, reports what its pods went through before failing.
func rolledOut(workload string) {
	out, err := run(6*time.Minute, kubectl, "-n", namespace, "rollout", "status", workload, "--timeout=5m")
	if err == nil {
		return
	}
	diagnose()
	Fail(fmt.Sprintf("%s was not rolled out in 5 minutes: %s%v", workload, out, err), 1)
}

// diagnose reports what the deployment's pods went through, for a failure
// to say why they are not Ready: their state, events, and the logs of
// each container, and of the one before it when it restarted.
func diagnose() {
	_, _ = run(time.Minute, kubectl, "get", "nodes", "-o", "wide")
	_, _ = run(time.Minute, kubectl, "-n", namespace, "get", "pods", "-o", "wide")
	_, _ = run(time.Minute, kubectl, "-n", namespace, "describe", "pods")
	_, _ = run(time.Minute, kubectl, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp")
	names, _ := run(time.Minute, kubectl, "-n", namespace, "get", "pods", "-o", "name")
	for _, pod := range strings.Fields(names) {
		_, _ = run(time.Minute, kubectl, "-n", namespace, "logs", pod, "--tail=100")
		_, _ = run(time.Minute, kubectl, "-n", namespace, "logs", pod, "--previous", "--tail=100")
	}
}

func runMake(timeout time.Duration, args ...string) string {
	// Named on the command line, so a developer's exported IMG or
	// BACKENDS cannot deploy something else.
	all := append([]string{"--no-print-directory", "-C", repo, "KUBECTL=" + kubectl, "VERSION=" + version,
		"IMAGE_NAME=sandbox-controller", "IMG=sandbox-controller:" + version, "BACKENDS=", "SANDBOX_POD_IMAGE=" + podImage(), "CONTAINER_BUNDLES=" + containerBundles()}, args...)
	out, err := run(timeout, "make", all...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "make %s: %s", strings.Join(args, " "), out)
	return out
}

// sandboxExec runs `kubectl sandbox exec` as a user types it.
func sandboxExec(claim string, flags []string, command ...string) string {
	args := append([]string{"sandbox", "exec"}, flags...)
	args = append(append(args, claim, "--"), command...)
	out, err := run(2*time.Minute, kubectl, args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "kubectl %s: %s", strings.Join(args, " "), out)
	return out
}

// kubepodsProcesses lists the processes in the kubelet's pod cgroups
// (hack/cluster.sh's cgroup root): the controller, its sandboxes, shims.
func kubepodsProcesses() []string {
	var left []string
	dirs, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		// The pods of either node.
		inPods := strings.Contains(string(cg), "/sandbox-controller-cluster/kubepods") || strings.Contains(string(cg), "/sandbox-controller-cluster-2/kubepods")
		if err != nil || !inPods {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		left = append(left, fmt.Sprintf("%d %s", pid, strings.TrimSpace(string(comm))))
	}
	return left
}

var _ = Describe("make deploy on a real cluster, used as a user would", Ordered, func() {
	var node string

	BeforeAll(func() {
		readNode2()
		for _, n := range strings.Fields(kc("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")) {
			if n != node2 {
				node = n
			}
		}
		Expect(node).NotTo(BeEmpty())
		// A run that was killed left its deployment, with what its specs
		// patched into the DaemonSet (the worktree example's hostPath):
		// make deploy's server-side apply would keep those fields.
		kc("-n", namespace, "delete", "daemonset", "sandbox-controller", "--ignore-not-found", "--wait", "--timeout=2m")
	})

	AfterAll(func() {
		// Whatever failed above, the cluster is left without the deployment.
		if !undeployed {
			// A spec that failed with the second node down leaves its
			// Sandboxes without a controller to release them.
			if node2 != "" {
				_, _ = run(5*time.Minute, filepath.Join(repo, "hack", "cluster.sh"), "node-up")
			}
			// What the controller saw, for the failure's report.
			_, _ = run(time.Minute, kubectl, "get", "sandboxes,sessionclaims", "-A", "-o", "yaml")
			_, _ = run(time.Minute, kubectl, "-n", namespace, "logs", "daemonset/sandbox-controller", "--tail=200")
			_, _ = run(time.Minute, kubectl, "-n", namespace, "logs", "deployment/sandbox-controller-api", "--tail=100")
			if _, err := run(3*time.Minute, kubectl, "delete", "sessionclaims,sandboxes", "--all", "-A", "--wait", "--timeout=1m"); err != nil {
				// The controller cannot release them (it failed): what it
				// made on the node stays, and the objects go.
				for _, kind := range []string{"sessionclaims", "sandboxes"} {
					out, _ := run(time.Minute, kubectl, "get", kind, "-A", "-o", `jsonpath={range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}`)
					for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
						if f := strings.Fields(line); len(f) == 2 {
							_, _ = run(time.Minute, kubectl, "-n", f[0], "patch", kind, f[1], "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
						}
					}
				}
			}
			_, _ = run(6*time.Minute, "make", "--no-print-directory", "-C", repo, "KUBECTL="+kubectl, "UNDEPLOY_TIMEOUT=1m", "undeploy")
		}
		if demoDir != "" {
			_ = os.RemoveAll(demoDir)
		}
	})

	It("builds the image and imports it into the node's containerd", func() {
		tar := os.Getenv("TEST_CLUSTER_IMAGE_TAR")
		if tar == "" {
			tar = filepath.Join(scratch, "image.tar")
			runMake(20*time.Minute, "image", "IMAGE_TAR="+tar)
		}
		// On both nodes, as on every node of a cluster.
		for _, addr := range []string{ctrAddress, node2Ctr} {
			out, err := run(5*time.Minute, ctr, "--address", addr, "-n", "k8s.io", "images", "import", tar)
			Expect(err).NotTo(HaveOccurred(), out)
			out, err = run(time.Minute, ctr, "--address", addr, "-n", "k8s.io", "images", "ls", "-q")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(strings.Fields(out)).To(ContainElement(imageRef))
		}
	})

	It("deploys, and the DaemonSet's pod becomes Ready", func() {
		runMake(10*time.Minute, "deploy")
		rolledOut("daemonset/sandbox-controller")
		rolledOut("deployment/sandbox-controller-api")
		if out, err := run(4*time.Minute, kubectl, "-n", namespace, "wait", "pod", "-l", "app.kubernetes.io/name=sandbox-controller", "--for=condition=Ready", "--timeout=3m"); err != nil {
			diagnose()
			Fail(fmt.Sprintf("the DaemonSet's pods are not Ready: %s%v", out, err))
		}
		Expect(strings.Fields(kc("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name=sandbox-controller", "-o", "jsonpath={.items[*].spec.nodeName}"))).
			To(ConsistOf(node, node2), "one pod of the DaemonSet on each node")

		By("metrics and probes answer on the node's loopback and nowhere else of its network")
		ip := net.ParseIP(strings.TrimSpace(kc("get", "node", node, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)))
		Expect(ip).NotTo(BeNil(), "node %s has no InternalIP", node)
		Expect(ip.IsLoopback()).To(BeFalse(), "the node's address must not be loopback for this check to mean anything")
		for _, port := range []string{"8080", "8081"} {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), port), 5*time.Second)
			if err == nil {
				_ = conn.Close()
			}
			Expect(err).To(HaveOccurred(), "port %s of the controller answers on the node's address %s", port, ip)
		}
		client := &http.Client{Timeout: 10 * time.Second}
		for _, url := range []string{"http://127.0.0.1:8080/metrics", "http://127.0.0.1:8081/readyz"} {
			resp, err := client.Get(url)
			Expect(err).NotTo(HaveOccurred())
			_ = resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusOK), url)
		}
	})

	It("serves the exec API through the API server (the APIService is Available)", func() {
		kc("wait", "apiservice/v1alpha1.subresources.sandbox.cireilclaw.dev", "--for=condition=Available", "--timeout=2m")
	})

	It("applies the samples and the claim becomes Ready on the node it was placed on", func() {
		kc("apply", "-f", "config/samples/")
		kc("wait", "sessionclaim/"+sampleCl, "--for=condition=Ready", "--timeout=3m")
		// The sample Sandbox names no node: the scheduler bound its Pod.
		Expect(kc("get", "sandbox", sampleSbx, "-o", "jsonpath={.spec.nodeName}")).To(BeEmpty())
		sampleNode = strings.TrimSpace(kc("get", "sandbox", sampleSbx, "-o", "jsonpath={.status.nodeName}"))
		Expect(sampleNode).To(BeElementOf(node, node2))
	})

	It("runs kubectl sandbox exec through the API server and on the node", func() {
		// The default: the API server serves the aggregated API, so through it.
		Expect(sandboxExec(sampleCl, nil, "git", "--version")).To(ContainSubstring("git version"))
		Expect(sandboxExec(sampleCl, []string{"--via", "api-server"}, "git", "--version")).To(ContainSubstring("git version"))
		Expect(sandboxExec(sampleCl, []string{"--via", "node"}, "git", "--version")).To(ContainSubstring("git version"))
		// The sample allows python3, which the image does not have: it fails
		// as on a machine without it (docs/cluster.md), not the exec.
		out, err := run(time.Minute, kubectl, "sandbox", "exec", sampleCl, "--", "python3", "-c", "print(1)")
		Expect(err).To(HaveOccurred(), out)
	})

	It("gives the sample Sandbox a Pod that kube-scheduler bound to the node and the kubelet runs", func() {
		sandboxPodRuns("default", sampleSbx, sampleNode)
	})

	It("runs a Sandbox's processes in its Pod's cgroup, and the kubelet and kubectl top pod count what they use", func() {
		podAccounting(node)
	})

	It("runs a bwrap Sandbox's commands from its own image: python3 from an image holding it", func() {
		bwrapImageSandbox()
	})

	It("keeps a Sandbox too big for any node Pending, in the scheduler's words", func() {
		tooBig()
	})

	It("spreads Sandboxes over the two nodes by their memory requests, and serves each through the API server from its node", func() {
		placed = spread(node)
	})

	It("moves a Sandbox off the second node when that node dies, and its areas stay there", func() {
		loseNode2(node, placed)
	})

	It("refuses a Sandbox over its namespace's ResourceQuota in the quota's words, and gives it the LimitRange's defaults once allowed", func() {
		quotaAndLimits()
	})

	It("follows the README's worktree example: a commit made inside is on the host", func() {
		var err error
		demoDir, err = os.MkdirTemp("", "realcluster-demo-")
		Expect(err).NotTo(HaveOccurred())
		Expect(os.Chmod(demoDir, 0o755)).To(Succeed())
		demoRepo = filepath.Join(demoDir, "app")
		Expect(os.MkdirAll(demoRepo, 0o755)).To(Succeed())
		// The controller's pod sees the node's directories only where they
		// are mounted into it: docs/cluster.md's overlay, as a patch.
		patch := fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/volumes/-","value":{"name":"projects","hostPath":{"path":%q,"type":"Directory"}}},`+
			`{"op":"add","path":"/spec/template/spec/containers/0/volumeMounts/-","value":{"name":"projects","mountPath":%q}}]`, demoDir, demoDir)
		kc("-n", namespace, "patch", "daemonset", "sandbox-controller", "--type=json", "-p", patch)
		kc("-n", namespace, "rollout", "status", "daemonset/sandbox-controller", "--timeout=3m")
		kc("-n", namespace, "wait", "pod", "-l", "app.kubernetes.io/name=sandbox-controller", "--for=condition=Ready", "--timeout=2m")
		for _, args := range [][]string{
			{"init", "-q", "-b", "main", demoRepo},
			{"-C", demoRepo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "first"},
		} {
			out, err := run(time.Minute, "git", args...)
			Expect(err).NotTo(HaveOccurred(), out)
		}
		// docs/examples/worktree.yaml with the repository where the
		// controller's pod sees it and git alone (the image has no sh).
		manifest := fmt.Sprintf(`apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: bob, namespace: default}
spec:
  agent: bob
  nodeName: %s
  backend: bwrap
  binaries: ["git"]
  mounts:
  - source: %s
    target: demo
    mode: rw
  idleTimeout: 5m
---
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: SessionClaim
metadata: {name: %s, namespace: default}
spec:
  sandboxName: bob
  session: "chat-2026-11-30-0002"
  worktree:
    repository: demo/app
    ref: main
    createBranch: true
`, node, demoDir, wtClaim)
		f := filepath.Join(scratch, "worktree.yaml")
		Expect(os.WriteFile(f, []byte(manifest), 0o600)).To(Succeed())
		kc("apply", "-f", f)
		// bob runs as a host id of its own: give it the project.
		agentDir := filepath.Join(areas, "areas", "bob")
		Eventually(func() error { _, err := os.Stat(agentDir); return err }).WithTimeout(2 * time.Minute).Should(Succeed())
		var st syscall.Stat_t
		Expect(syscall.Stat(agentDir, &st)).To(Succeed())
		Expect(testenv.ChownTree(demoDir, st.Uid, st.Gid)).To(Succeed())
		kc("wait", "sessionclaim/"+wtClaim, "--for=condition=WorktreeReady", "--timeout=2m")
		Expect(kc("get", "sessionclaim", wtClaim, "-o", "jsonpath={.status.worktree.path}")).To(Equal(wtInside))
		Expect(sandboxExec(wtClaim, nil, "git", "-C", wtInside, "status")).To(ContainSubstring("On branch " + wtClaim))
		sandboxExec(wtClaim, nil, "git", "-C", wtInside, "-c", "user.name=bob", "-c", "user.email=bob@example.com",
			"commit", "-q", "--allow-empty", "-m", "Fix the login")
		out, err := run(time.Minute, "git", "-c", "safe.directory="+demoRepo, "-C", demoRepo, "log", "--oneline", wtClaim)
		Expect(err).NotTo(HaveOccurred(), out)
		GinkgoWriter.Printf("$ git log --oneline %s  (on the host)\n%s\n", wtClaim, out)
		Expect(out).To(ContainSubstring("Fix the login"))
		kc("delete", "sessionclaim", wtClaim, "--timeout=2m")
		// Clean: the worktree goes, the branch stays.
		Eventually(func() bool {
			_, err := os.Stat(filepath.Join(demoRepo, ".worktrees", wtClaim))
			return os.IsNotExist(err)
		}).
			WithTimeout(time.Minute).Should(BeTrue())
		out, err = run(time.Minute, "git", "-c", "safe.directory="+demoRepo, "-C", demoRepo, "branch", "--list", wtClaim)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(wtClaim))
	})

	It("runs a containerd Sandbox from the DaemonSet on the node's containerd, its mount tree in the node's mount namespace", func() {
		deployContainerd(node)
		containerdSandboxRuns()
	})

	It("deletes everything, undeploys, and nothing is left but the agents' areas", func() {
		kc("delete", "sessionclaims,sandboxes", "--all", "-A", "--wait", "--timeout=2m")
		kc("delete", "-f", "config/samples/", "--ignore-not-found", "--wait", "--timeout=1m")
		containerdLeftNothing()
		runMake(10*time.Minute, "undeploy")
		undeployed = true

		out := kc("get", "crd", "-o", "name")
		Expect(out).NotTo(ContainSubstring("sandbox.cireilclaw.dev"))
		out = kc("get", "apiservice", "-o", "name")
		Expect(out).NotTo(ContainSubstring("cireilclaw"))
		out = kc("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings", "-A",
			"-l", "app.kubernetes.io/part-of=sandbox-controller", "-o", "name")
		Expect(strings.TrimSpace(out)).To(BeEmpty())
		out = kc("get", "rolebindings", "-n", "kube-system", "-l", "app.kubernetes.io/part-of=sandbox-controller", "-o", "name")
		Expect(strings.TrimSpace(out)).To(BeEmpty())
		Eventually(func() string {
			out, _ := run(time.Minute, kubectl, "get", "namespace", namespace, "--ignore-not-found", "-o", "name")
			return strings.TrimSpace(out)
		}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(BeEmpty())
		// The Sandboxes' Pods went with them (the garbage collector).
		Eventually(func() string { return strings.TrimSpace(kc("get", "pods", "-A", "-o", "name")) }).
			WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(BeEmpty())
		// No instance, controller or shim process is left in the pods' cgroups.
		Eventually(kubepodsProcesses).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeEmpty())
		// The agents' areas stay on the node (make undeploy says so).
		for agent, on := range map[string]string{"alice": sampleNode, "bob": node, ctrdSandbox: node} {
			Expect(filepath.Join(areasOf(on), agent, "workspace")).To(BeADirectory())
		}
	})
})

// undeployed is set once make undeploy has run: AfterAll runs it when a
// spec before failed.
var undeployed bool
