//go:build realcluster

package realcluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/gomega"
)

// A bwrap Sandbox naming an image: the python test image (hack/test-image.sh
// python), imported into both nodes' containerd as a registry would serve
// it. Its Pod runs that image with the holder copied in from the
// controller's image, and the node's controller binds the container's
// root file system as the system directories of the Sandbox's commands.

const (
	imageSandbox = "pia"
	imageClaim   = "pia-1"
)

// containerBundles is where the cluster's containerd keeps its bundles
// for the kubelet's containers (hack/cluster.sh: state below the socket's
// directory), on either node: the second node's mount namespace has its
// own directory at the same path.
func containerBundles() string {
	return filepath.Join(filepath.Dir(ctrAddress), "state", "io.containerd.runtime.v2.task", "k8s.io")
}

func bwrapImageSandbox() {
	tar := strings.TrimSpace(stdoutOf(5*time.Minute, filepath.Join(repo, "hack", "test-image.sh"), "python"))
	image := strings.TrimSpace(stdoutOf(time.Minute, filepath.Join(repo, "hack", "test-image.sh"), "--name", "python"))
	for _, addr := range []string{ctrAddress, node2Ctr} {
		stdoutOf(5*time.Minute, ctr, "--address", addr, "-n", "k8s.io", "images", "import", tar)
	}
	manifest := fmt.Sprintf(`apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: %[1]s, namespace: default}
spec:
  agent: %[1]s
  backend: bwrap
  bwrap:
    image: %[2]s
  binaries: ["python3", "git"]
  resources:
    requests: {memory: 32Mi}
  idleTimeout: 5m
---
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: SessionClaim
metadata: {name: %[3]s, namespace: default}
spec:
  sandboxName: %[1]s
  session: "chat-%[1]s"
`, imageSandbox, image, imageClaim)
	f := filepath.Join(scratch, "image.yaml")
	Expect(os.WriteFile(f, []byte(manifest), 0o600)).To(Succeed())
	kc("apply", "-f", f)
	if out, err := run(4*time.Minute, kubectl, "wait", "sessionclaim/"+imageClaim, "--for=condition=Ready", "--timeout=3m"); err != nil {
		_, _ = run(time.Minute, kubectl, "get", "sandbox", imageSandbox, "-o", "yaml")
		_, _ = run(time.Minute, kubectl, "describe", "pod", "-l", "sandbox.cireilclaw.dev/sandbox-pod=true")
		Expect(err).NotTo(HaveOccurred(), out)
	}

	pod := kc("get", "sandbox", imageSandbox, "-o", "jsonpath={.status.pod.name}")
	Expect(kc("get", "pod", pod, "-o", "jsonpath={.spec.containers[0].image}")).To(Equal(image))
	Expect(kc("get", "pod", pod, "-o", "jsonpath={.status.initContainerStatuses[0].state.terminated.reason}")).To(Equal("Completed"),
		"the init container copied the holder in")

	// python3 is the image's: neither the node nor the controller's
	// image has it, and what it reads of /usr is the image's, with none
	// of the controller image's files.
	script := "import os; print(open('/usr/share/sandbox-test/marker').read().strip()); " +
		"print('controller-visible' if os.path.exists('/usr/local/bin/sandbox-controller') else 'controller-hidden'); print(os.getuid())"
	out := sandboxExec(imageClaim, nil, "python3", "-c", script)
	Expect(out).To(ContainSubstring("from the python test image"))
	Expect(out).To(ContainSubstring("controller-hidden"))
	lines := strings.Fields(out)
	Expect(lines[len(lines)-1]).NotTo(Equal("0"), "the command ran as root")
	Expect(sandboxExec(imageClaim, []string{"--via", "node"}, "python3", "-c", "print(6*7)")).To(ContainSubstring("42"))
	// git is allowed but not in the image: it is not the controller's git.
	out, err := run(time.Minute, kubectl, "sandbox", "exec", imageClaim, "--", "git", "--version")
	Expect(err).To(HaveOccurred(), out)
	Expect(out).To(ContainSubstring("not in the image"))

	// Files written in the workspace are on the node, in the agent's area.
	sandboxExec(imageClaim, nil, "python3", "-c", "open('/workspace/from-image','w').write('ok')")
	ran := kc("get", "sandbox", imageSandbox, "-o", "jsonpath={.status.nodeName}")
	Expect(os.ReadFile(filepath.Join(areasOf(ran), imageSandbox, "workspace", "from-image"))).To(Equal([]byte("ok")))

	kc("delete", "-f", f, "--wait", "--timeout=2m")
}
