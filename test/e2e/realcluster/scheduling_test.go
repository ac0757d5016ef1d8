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
)

// What the cluster does with the Pod each Sandbox gets: kube-scheduler
// binds it (or says why it cannot), kube-controller-manager's quota
// controller counts it, LimitRange admission gives it defaults, and the
// kubelet runs it. All of it is the cluster's own, in its own words.

// podImage is the pause image hack/cluster.sh imports into the node's
// containerd: the image of the Sandboxes' Pods (make deploy's
// SANDBOX_POD_IMAGE), as a cluster's nodes hold registry.k8s.io/pause.
func podImage() string {
	img := os.Getenv("CLUSTER_PAUSE_IMAGE")
	Expect(img).NotTo(BeEmpty(), "CLUSTER_PAUSE_IMAGE is not set: run the suite through hack/test-cluster.sh")
	return img
}

// sandboxPodRuns checks that a Sandbox's Pod was bound by kube-scheduler
// to node and that the node's kubelet runs it, and that the Sandbox says
// the same node.
func sandboxPodRuns(ns, sandbox, node string) {
	pod := sandbox + "-sandbox"
	kc("-n", ns, "wait", "pod/"+pod, "--for=condition=Ready", "--timeout=2m")
	Expect(kc("-n", ns, "get", "pod", pod, "-o", "jsonpath={.spec.nodeName}")).To(Equal(node))
	Expect(kc("-n", ns, "get", "pod", pod, "-o", "jsonpath={.spec.schedulerName}")).To(Equal("default-scheduler"))
	Expect(kc("-n", ns, "get", "pod", pod, "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}")).To(Equal("Sandbox/" + sandbox))
	Expect(kc("-n", ns, "get", "sandbox", sandbox, "-o", "jsonpath={.status.nodeName}")).To(Equal(node))
}

// readyMessage is a Sandbox's Ready condition as reason and message.
func readyMessage(ns, sandbox string) string {
	out, _ := run(time.Minute, kubectl, "-n", ns, "get", "sandbox", sandbox, "-o",
		`jsonpath={.status.conditions[?(@.type=="Ready")].reason}: {.status.conditions[?(@.type=="Ready")].message}`)
	return strings.TrimSpace(out)
}

func applyManifest(name, manifest string) {
	f := filepath.Join(scratch, name+".yaml")
	Expect(os.WriteFile(f, []byte(manifest), 0o600)).To(Succeed())
	kc("apply", "-f", f)
}

// tooBig asks for more memory than the node has: its Pod stays Pending and
// the Sandbox says why in the scheduler's words.
func tooBig() {
	applyManifest("too-big", `apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: too-big, namespace: default}
spec:
  agent: too-big
  binaries: ["git"]
  resources:
    requests: {memory: 64Ti}
`)
	Eventually(func() string { return readyMessage("default", "too-big") }).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(
		And(HavePrefix("Unschedulable: "), ContainSubstring("nodes are available"), ContainSubstring("Insufficient memory")))
	Expect(kc("get", "sandbox", "too-big", "-o", "jsonpath={.status.nodeName}")).To(BeEmpty())
	Expect(kc("get", "pod", "too-big-sandbox", "-o", "jsonpath={.status.phase}")).To(Equal("Pending"))
	GinkgoWriter.Printf("%s", kc("get", "sandboxes", "-o", "wide"))
	kc("delete", "sandbox", "too-big", "--wait", "--timeout=2m")
}

// quotaAndLimits: a namespace whose ResourceQuota allows no Pod refuses the
// Sandbox's, in the quota's words; once the quota allows one, the Pod is
// made with the LimitRange's defaults, bound and run.
func quotaAndLimits() {
	const ns = "quota-test"
	applyManifest("quota", fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: LimitRange
metadata: {name: defaults, namespace: %[1]s}
spec:
  limits:
  - type: Container
    defaultRequest: {memory: 48Mi}
    default: {memory: 96Mi}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: no-pods, namespace: %[1]s}
spec:
  hard: {pods: "0"}
`, ns))
	// The quota counts once kube-controller-manager has written its status.
	kc("-n", ns, "wait", "resourcequota/no-pods", "--for=jsonpath={.status.hard.pods}=0", "--timeout=2m")
	applyManifest("quota-sandbox", fmt.Sprintf(`apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: counted, namespace: %s}
spec:
  agent: counted
  binaries: ["git"]
`, ns))
	Eventually(func() string { return readyMessage(ns, "counted") }).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(
		And(HavePrefix("PodRefused: "), ContainSubstring("exceeded quota: no-pods"), ContainSubstring("pods=0")))
	Expect(kc("-n", ns, "get", "events", "--field-selector", "reason=PodRefused,involvedObject.name=counted", "-o", "jsonpath={.items[*].message}")).
		To(ContainSubstring("exceeded quota"))

	kc("-n", ns, "patch", "resourcequota", "no-pods", "--type=merge", "-p", `{"spec":{"hard":{"pods":"1"}}}`)
	var node string
	Eventually(func() string {
		out, _ := run(time.Minute, kubectl, "-n", ns, "get", "sandbox", "counted", "-o", "jsonpath={.status.nodeName}")
		node = strings.TrimSpace(out)
		return node
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).ShouldNot(BeEmpty(), "placed once the quota allows its Pod")
	sandboxPodRuns(ns, "counted", node)
	Expect(kc("-n", ns, "get", "pod", "counted-sandbox", "-o", "jsonpath={.spec.containers[0].resources.requests.memory}/{.spec.containers[0].resources.limits.memory}")).
		To(Equal("48Mi/96Mi"), "the LimitRange's defaults apply to the Sandbox's Pod")
	Eventually(func() string {
		out, _ := run(time.Minute, kubectl, "-n", ns, "get", "resourcequota", "no-pods", "-o", "jsonpath={.status.used.pods}")
		return strings.TrimSpace(out)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("1"), "the quota counts the Sandbox's Pod")
	kc("delete", "namespace", ns, "--wait", "--timeout=3m")
}
