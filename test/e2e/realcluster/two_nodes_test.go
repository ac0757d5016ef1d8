//go:build realcluster

package realcluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The cluster's second node (hack/cluster.sh, CLUSTER_NODES=2): a second
// kubelet with its own containerd, network namespace and mount namespace,
// so our DaemonSet runs a pod there with that node's own areas, exec API
// address and loopback. node-down kills every process of it at once, as a
// machine that dies; node-up starts it again.
var (
	node2      string
	node2Areas string
	node2Ctr   string
)

func readNode2() {
	node2 = os.Getenv("CLUSTER_NODE2")
	node2Areas = os.Getenv("CLUSTER_NODE2_AREAS")
	node2Ctr = os.Getenv("CLUSTER_NODE2_CONTAINERD_ADDRESS")
	if node2 == "" || node2Areas == "" || node2Ctr == "" {
		testenv.Missing(GinkgoT(), "the cluster's second node", "run the suite through hack/test-cluster.sh, which starts the cluster with CLUSTER_NODES=2")
	}
}

// areasOf is where a node keeps the agents' areas on this machine.
func areasOf(node string) string {
	if node == node2 {
		return filepath.Join(node2Areas, "areas")
	}
	return filepath.Join(areas, "areas")
}

// The two Sandboxes the spread places; each asks for 60% of a node's
// memory, so no node takes both.
var spreadSandboxes = []string{"carol", "dave"}

// agentOf is the agent of a spread Sandbox: its name and this run's, as
// areas outlive the Sandboxes (and the suite's runs) on the nodes.
func agentOf(sandbox string) string { return fmt.Sprintf("%s-%d", sandbox, runStarted.Unix()) }

var runStarted = time.Now()

// spread applies two Sandboxes, each requesting more than half of a node's
// allocatable memory: kube-scheduler binds one Pod to each node. A command
// through the API server on each writes into the areas of the node it is
// on. It returns where each went.
func spread(first string) map[string]string {
	alloc := resource.MustParse(strings.TrimSpace(kc("get", "node", first, "-o", "jsonpath={.status.allocatable.memory}")))
	request := resource.NewQuantity(alloc.Value()*6/10/(1<<20)*(1<<20), resource.BinarySI)
	var manifest strings.Builder
	for _, name := range spreadSandboxes {
		fmt.Fprintf(&manifest, `apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: %[1]s, namespace: default}
spec:
  agent: %[3]s
  backend: bwrap
  binaries: ["git"]
  onNodeLost: Move
  # A shorter toleration of the node's loss than the placer's default:
  # the Pod is evicted 5 s after its node is counted unreachable.
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  resources:
    requests: {memory: "%[2]s"}
  idleTimeout: 5m
---
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: SessionClaim
metadata: {name: %[1]s-1, namespace: default}
spec:
  sandboxName: %[1]s
  session: "chat-%[1]s"
---
`, name, request.String(), agentOf(name))
	}
	applyManifest("spread", manifest.String())

	placed := map[string]string{}
	Eventually(func(g Gomega) {
		for _, name := range spreadSandboxes {
			out, _ := run(time.Minute, kubectl, "get", "sandbox", name, "-o", "jsonpath={.status.nodeName}")
			placed[name] = strings.TrimSpace(out)
			g.Expect(placed[name]).NotTo(BeEmpty(), "Sandbox %s is not placed: %s", name, readyMessage("default", name))
		}
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	Expect([]string{placed["carol"], placed["dave"]}).To(ConsistOf(first, node2), "the scheduler puts one on each node: both do not fit on one (%s each)", request)
	GinkgoWriter.Printf("%s", kc("get", "sandboxes", "-o", "wide"))

	for _, name := range spreadSandboxes {
		claim := name + "-1"
		sandboxPodRuns("default", name, placed[name])
		kc("wait", "sessionclaim/"+claim, "--for=condition=Ready", "--timeout=3m")
		// Through the API server: the aggregated API forwards to the node
		// that runs the Sandbox.
		sandboxExec(claim, []string{"--via", "api-server"}, "git", "init", "-q", "/workspace/proof")
		other := first
		if placed[name] == first {
			other = node2
		}
		Expect(filepath.Join(areasOf(placed[name]), agentOf(name), "workspace", "proof", ".git")).To(BeADirectory(), "the command ran on %s", placed[name])
		Expect(filepath.Join(areasOf(other), agentOf(name), "workspace", "proof")).NotTo(BeAnExistingFile())
		if placed[name] == node2 {
			// The shortest path, straight to the second node, works too.
			Expect(sandboxExec(claim, []string{"--via", "node"}, "git", "--version")).To(ContainSubstring("git version"))
		}
	}
	return placed
}

// loseNode2 kills the second node: its Node goes NotReady, the node
// lifecycle controller taints it and evicts the Pod of the Sandbox there
// (onNodeLost: Move), which a new Pod on the first node replaces; the
// Sandbox runs there with that node's areas, and its areas on the lost
// node stay. The node is started again after, and removes the instance it
// was running.
func loseNode2(first string, placed map[string]string) {
	var moving, staying string
	for name, n := range placed {
		if n == node2 {
			moving = name
		} else {
			staying = name
		}
	}
	Expect(moving).NotTo(BeEmpty(), "no Sandbox is on the second node")
	// Room on the first node for the one that moves.
	kc("delete", "sandbox", staying, "--wait", "--timeout=2m")
	kc("delete", "sessionclaim", staying+"-1", "--ignore-not-found", "--wait", "--timeout=1m")

	out, err := run(2*time.Minute, filepath.Join(repo, "hack", "cluster.sh"), "node-down")
	Expect(err).NotTo(HaveOccurred(), out)
	lostAt := time.Now()
	Eventually(func() string {
		out, _ := run(time.Minute, kubectl, "get", "sandbox", moving, "-o", "jsonpath={.status.nodeName}")
		return strings.TrimSpace(out)
	}).WithTimeout(4*time.Minute).WithPolling(2*time.Second).Should(Equal(first), "Sandbox %s moves off the lost node", moving)
	GinkgoWriter.Printf("moved %s to %s %s after the second node died\n", moving, first, time.Since(lostAt).Round(time.Second))
	// This Sandbox's own Events (a cluster kept from an earlier run holds
	// those of the Sandbox of the same name then).
	uid := strings.TrimSpace(kc("get", "sandbox", moving, "-o", "jsonpath={.metadata.uid}"))
	Expect(kc("get", "events", "--field-selector", "reason=NodeLost,involvedObject.kind=Sandbox,involvedObject.uid="+uid,
		"-o", "jsonpath={.items[*].message}")).To(And(ContainSubstring("node "+node2+" not Ready since"), ContainSubstring("moved to node "+first)))

	claim := moving + "-1"
	kc("wait", "sessionclaim/"+claim, "--for=condition=Ready", "--timeout=3m")
	sandboxExec(claim, nil, "git", "init", "-q", "/workspace/after-move")
	agent := agentOf(moving)
	Expect(filepath.Join(areasOf(first), agent, "workspace", "after-move", ".git")).To(BeADirectory())
	// Areas are node-local: what the agent had on the lost node is there,
	// untouched, and was not copied.
	Expect(filepath.Join(areasOf(node2), agent, "workspace", "proof", ".git")).To(BeADirectory())
	Expect(filepath.Join(areasOf(first), agent, "workspace", "proof")).NotTo(BeAnExistingFile())

	out, err = run(5*time.Minute, filepath.Join(repo, "hack", "cluster.sh"), "node-up")
	Expect(err).NotTo(HaveOccurred(), out)
	kc("wait", "node/"+node2, "--for=condition=Ready", "--timeout=3m")
	kc("-n", namespace, "rollout", "status", "daemonset/sandbox-controller", "--timeout=3m")
	// The Pod evicted from the lost node goes once its kubelet is back.
	Eventually(func() string {
		out, _ := run(time.Minute, kubectl, "get", "pod", moving+"-sandbox", "--ignore-not-found", "-o", "name")
		return strings.TrimSpace(out)
	}).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(BeEmpty(), "the evicted Pod is gone once the node is back")
}
