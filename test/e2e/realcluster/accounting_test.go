//go:build realcluster

package realcluster_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// The kubelet accounts for a Sandbox: its processes run in the cgroup of
// its Pod (the node's controller finds it by status.pod), so what the
// kubelet reports for the Pod, and evicts by, is what the agent uses.

// workingSet is a memory working set in the kubelet's summary API.
type workingSet struct {
	WorkingSetBytes *uint64 `json:"workingSetBytes"`
}

// summaryPod is the part of the kubelet's summary API (stats/summary) read
// here: what the kubelet's eviction ranks Pods by (their containers').
type summaryPod struct {
	PodRef struct {
		UID string `json:"uid"`
	} `json:"podRef"`
	Containers []struct {
		Name   string      `json:"name"`
		Memory *workingSet `json:"memory"`
	} `json:"containers"`
}

// containerWorkingSet is the memory working set the node's kubelet reports
// for the container of the Sandbox's Pod with uid; -1 while it reports
// none.
func containerWorkingSet(node, uid string) int64 {
	out, err := run(time.Minute, kubectl, "get", "--raw", "/api/v1/nodes/"+node+"/proxy/stats/summary")
	if err != nil {
		return -1
	}
	var summary struct {
		Pods []summaryPod `json:"pods"`
	}
	if json.Unmarshal([]byte(out), &summary) != nil {
		return -1
	}
	for _, p := range summary.Pods {
		if p.PodRef.UID != uid {
			continue
		}
		for _, c := range p.Containers {
			if c.Name == "sandbox" && c.Memory != nil && c.Memory.WorkingSetBytes != nil {
				return int64(*c.Memory.WorkingSetBytes)
			}
		}
	}
	return -1
}

// topMemory is the memory kubectl top (the Metrics API, metrics-server)
// gives the Pod, in bytes; -1 while it gives none.
func topMemory(pod string) int64 {
	out, err := run(time.Minute, kubectl, "top", "pod", pod, "--no-headers")
	if err != nil {
		return -1
	}
	f := strings.Fields(out)
	if len(f) < 3 {
		return -1
	}
	q, err := resource.ParseQuantity(f[2])
	if err != nil {
		return -1
	}
	return q.Value()
}

// podAccounting runs a command holding 96 MiB in a bwrap Sandbox on node:
// what the kubelet reports for the container of the Sandbox's Pod, and
// kubectl top pod, grow by it, and the command is in a cgroup below the
// Pod's on the node.
func podAccounting(node string) {
	const name = "busy"
	agent := agentOf(name)
	applyManifest(name, fmt.Sprintf(`apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: %[1]s, namespace: default}
spec:
  agent: %[2]s
  backend: bwrap
  binaries: ["git"]
  nodeName: %[3]s
  resources:
    requests: {memory: 256Mi, cpu: 200m}
    limits: {memory: 256Mi, cpu: "1"}
---
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: SessionClaim
metadata: {name: %[1]s-1, namespace: default}
spec:
  sandboxName: %[1]s
  session: chat-busy
`, name, agent, node))
	kc("wait", "sessionclaim/"+name+"-1", "--for=condition=Ready", "--timeout=3m")
	sandboxPodRuns("default", name, node)
	uid := strings.TrimSpace(kc("get", "pod", name+"-sandbox", "-o", "jsonpath={.metadata.uid}"))
	Expect(kc("get", "sandbox", name, "-o", "jsonpath={.status.pod.name}/{.status.pod.uid}")).To(Equal(name + "-sandbox/" + uid))

	// The Pod alone: pause, a few hundred KiB.
	var idle, idleTop int64
	Eventually(func() int64 { idle = containerWorkingSet(node, uid); return idle }).WithTimeout(2*time.Minute).WithPolling(2*time.Second).
		Should(BeNumerically(">=", 0), "the kubelet reports no memory for Pod %s", uid)
	Eventually(func() int64 { idleTop = topMemory(name + "-sandbox"); return idleTop }).WithTimeout(2*time.Minute).WithPolling(2*time.Second).
		Should(BeNumerically(">=", 0), "kubectl top gives no memory for Pod %s", uid)

	// git hash-object --stdin reads all of its input into memory before
	// it hashes; while the input stays open, it holds what it read.
	const held = 96 << 20
	cmd, cancel := testenv.Command(5*time.Minute, kubectl, "sandbox", "exec", "-i", name+"-1", "--", "git", "hash-object", "--stdin")
	defer cancel()
	cmd.Env = append(os.Environ(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	stdin, err := cmd.StdinPipe()
	Expect(err).NotTo(HaveOccurred())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	_, err = io.CopyN(stdin, zeros{}, held)
	Expect(err).NotTo(HaveOccurred())

	// The kubelet's summary, which its eviction ranks by, and kubectl top
	// (metrics-server, from the kubelet's resource metrics) count it for
	// the Pod's container.
	var busy, busyTop int64
	Eventually(func() int64 { busy = containerWorkingSet(node, uid); return busy }).WithTimeout(2*time.Minute).WithPolling(2*time.Second).
		Should(BeNumerically(">=", idle+held*3/4), "the kubelet counts the sandbox's memory in its Pod's container")
	Eventually(func() int64 { busyTop = topMemory(name + "-sandbox"); return busyTop }).WithTimeout(3*time.Minute).WithPolling(5*time.Second).
		Should(BeNumerically(">=", idleTop+held*3/4), "kubectl top pod counts the sandbox's memory")
	GinkgoWriter.Printf("Pod %s: working set %d KiB idle, %d KiB with the command holding %d KiB; kubectl top %d KiB, then %d KiB\n",
		uid, idle>>10, busy>>10, held>>10, idleTop>>10, busyTop>>10)

	// The Sandbox's own status.usage reads the instance's cgroup, below
	// the Pod's container.
	Eventually(func() int64 {
		out, err := run(time.Minute, kubectl, "get", "sandbox", name, "-o", "jsonpath={.status.usage.memory}")
		q, perr := resource.ParseQuantity(strings.TrimSpace(out))
		if err != nil || perr != nil {
			return -1
		}
		return q.Value()
	}).WithTimeout(2*time.Minute).WithPolling(5*time.Second).Should(BeNumerically(">=", held*3/4), "status.usage counts the command's memory")

	// On the node: the command's cgroup is below the Pod's.
	Expect(podCgroupProcesses(uid, "git")).NotTo(BeEmpty(), "no git process in a cgroup below Pod %s", uid)

	Expect(stdin.Close()).To(Succeed())
	Expect(cmd.Wait()).To(Succeed())
	Expect(strings.TrimSpace(out.String())).To(MatchRegexp(`^[0-9a-f]{40}$`))

	kc("delete", "sandbox", name, "--wait", "--timeout=2m")
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// podCgroupProcesses lists the processes named comm whose memory cgroup
// (or v2 cgroup) is below the cgroup of the Pod with uid.
func podCgroupProcesses(uid, comm string) []int {
	var found []int
	procs, err := filepath.Glob("/proc/[0-9]*")
	Expect(err).NotTo(HaveOccurred())
	for _, p := range procs {
		c, err := os.ReadFile(filepath.Join(p, "comm"))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(p, "cgroup"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(cg), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && (parts[1] == "memory" || parts[1] == "") && strings.Contains(parts[2], "/pod"+uid+"/") {
				var pid int
				_, _ = fmt.Sscan(filepath.Base(p), &pid)
				found = append(found, pid)
				break
			}
		}
	}
	return found
}
