//go:build realcluster

package realcluster_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The containerd backend from the DaemonSet, through the node's own
// containerd: here the cluster's, whose socket is not at /run/containerd,
// so an overlay of config/default with the containerd component points the
// pod at it, as docs/cluster.md tells a user whose containerd lives
// elsewhere. The driver builds each container's mount tree in the node's
// mount namespace (CONTAINERD_MOUNT_NAMESPACE=daemon from the
// component), where the node's runc looks for it.

const (
	ctrdSandbox = "erin"
	ctrdClaim   = "erin-1"
	// ctrdNamespace is the containerd namespace the component's
	// controller uses, apart from the kubelet's k8s.io.
	ctrdNamespace = containerd.DefaultNamespace
)

// deployContainerd imports the test image into the node's containerd and
// applies the deployment again with the containerd component.
func deployContainerd(node string) {
	tar := strings.TrimSpace(stdoutOf(10*time.Minute, filepath.Join(repo, "hack", "test-image.sh"), "busybox"))
	image := strings.TrimSpace(stdoutOf(time.Minute, filepath.Join(repo, "hack", "test-image.sh"), "--name", "busybox"))
	stdoutOf(5*time.Minute, ctr, "--address", ctrAddress, "-n", ctrdNamespace, "images", "import", tar)

	sockDir := filepath.Dir(ctrAddress)
	fifoDir := filepath.Join(sockDir, "fifo")
	Expect(os.MkdirAll(fifoDir, 0o700)).To(Succeed())
	overlay := filepath.Join(scratch, "containerd-overlay")
	Expect(os.MkdirAll(overlay, 0o755)).To(Succeed())
	rel := func(p string) string {
		r, err := filepath.Rel(overlay, filepath.Join(repo, p))
		Expect(err).NotTo(HaveOccurred())
		return r
	}
	kustomization := fmt.Sprintf(`resources:
- %s
components:
- %s
images:
- name: sandbox-controller
  newTag: %s
patches:
- patch: |-
    apiVersion: apps/v1
    kind: DaemonSet
    metadata: {name: sandbox-controller, namespace: %s}
    spec:
      template:
        spec:
          containers:
          - name: manager
            env:
            - {name: CONTAINERD_ADDRESS, value: %q}
            - {name: CONTAINERD_FIFO_DIR, value: %q}
            volumeMounts:
            - {name: containerd, mountPath: %q, mountPropagation: HostToContainer}
          volumes:
          - name: containerd
            hostPath: {path: %q, type: Directory}
          - name: container-bundles
            hostPath: {path: %q, type: DirectoryOrCreate}
# The Sandboxes' Pods keep the pause image this cluster holds, as make
# deploy SANDBOX_POD_IMAGE set it: a Pod whose image cannot be pulled never
# runs, and its Sandbox waits for it (PodStarting).
- target: {kind: Deployment, name: sandbox-controller-api}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {name: SANDBOX_POD_IMAGE, value: %q}
`, rel("config/default"), rel("config/backends/containerd"), version, namespace, ctrAddress, fifoDir, sockDir, sockDir, containerBundles(), podImage())
	Expect(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644)).To(Succeed())
	kc("apply", "--server-side", "--field-manager=sandbox-controller-deploy", "-k", overlay)
	kc("-n", namespace, "rollout", "status", "daemonset/sandbox-controller", "--timeout=3m")
	kc("-n", namespace, "wait", "pod", "-l", "app.kubernetes.io/name=sandbox-controller", "--for=condition=Ready", "--timeout=2m")
	Expect(kc("-n", namespace, "get", "daemonset", "sandbox-controller", "-o", "jsonpath={.spec.template.spec.hostPID}")).To(Equal("true"))

	manifest := fmt.Sprintf(`apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: %[1]s, namespace: default}
spec:
  agent: %[1]s
  # The test image is imported into the first node's containerd only.
  nodeName: %[5]s
  backend: containerd
  containerd:
    image: %[2]s
  binaries: ["git", "ls", "touch"]
  mounts:
  - source: %[3]s
    target: demo
    mode: ro
  idleTimeout: 5m
---
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: SessionClaim
metadata: {name: %[4]s, namespace: default}
spec:
  sandboxName: %[1]s
  session: "chat-%[1]s"
`, ctrdSandbox, image, demoDir, ctrdClaim, node)
	f := filepath.Join(scratch, "containerd.yaml")
	Expect(os.WriteFile(f, []byte(manifest), 0o600)).To(Succeed())
	kc("apply", "-f", f)
}

// containerdSandboxRuns checks the claim on the containerd Sandbox: its
// container runs on the node's containerd, its areas come from a mount
// tree in the node's mount namespace, and commands through the API server
// write into the node's areas and see the custom mount.
func containerdSandboxRuns() {
	kc("wait", "sessionclaim/"+ctrdClaim, "--for=condition=Ready", "--timeout=3m")
	out := stdoutOf(time.Minute, ctr, "--address", ctrAddress, "-n", ctrdNamespace, "tasks", "ls")
	Expect(out).To(ContainSubstring("cireilclaw-"+ctrdSandbox), "the container runs on the node's containerd")
	Expect(out).To(ContainSubstring("RUNNING"))
	// The tree runc bound the areas from is a mount of the node's (this
	// process's) namespace, not the controller pod's.
	Expect(treeMounts()).NotTo(BeEmpty(), "no mount tree below %s in the node's mount namespace", containerd.DefaultTreesDir)

	sandboxExec(ctrdClaim, nil, "touch", "/workspace/from-containerd")
	Expect(filepath.Join(areas, "areas", ctrdSandbox, "workspace", "from-containerd")).To(BeAnExistingFile())
	Expect(sandboxExec(ctrdClaim, []string{"--via", "node"}, "ls", "/workspace/demo/app/.git")).To(ContainSubstring("HEAD"),
		"the custom mount is in the container, beneath the workspace")
	Expect(sandboxExec(ctrdClaim, nil, "git", "--version")).To(ContainSubstring("git version"))
}

// containerdLeftNothing checks, after every Sandbox is deleted, that no
// container of the controller's and no mount tree is left on the node.
func containerdLeftNothing() {
	Eventually(func() string {
		return strings.TrimSpace(stdoutOf(time.Minute, ctr, "--address", ctrAddress, "-n", ctrdNamespace, "containers", "ls", "-q"))
	}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(BeEmpty())
	Expect(treeMounts()).To(BeEmpty())
}

// treeMounts lists the mounts below the containerd driver's trees in this
// process's mount namespace, the node's.
func treeMounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], containerd.DefaultTreesDir+"/") {
			found = append(found, fields[4])
		}
	}
	Expect(sc.Err()).NotTo(HaveOccurred())
	return found
}

// stdoutOf runs a command and returns its standard output alone (ctr
// warns about cgroup v1 on its standard error); it fails the spec when the
// command does.
func stdoutOf(timeout time.Duration, name string, args ...string) string {
	cmd, cancel := testenv.Command(timeout, name, args...)
	defer cancel()
	cmd.Dir = repo
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	GinkgoWriter.Printf("$ %s %s\n%s%s\n", filepath.Base(name), strings.Join(args, " "), out, stderr.String())
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "%s %s: %s", filepath.Base(name), strings.Join(args, " "), stderr.String())
	return string(out)
}
