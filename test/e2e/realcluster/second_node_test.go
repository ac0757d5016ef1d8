//go:build realcluster

package realcluster_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

// secondNode is a second node of the cluster: the controller binary run on
// this machine the way the DaemonSet runs it on every node, with a node
// name, areas and exec API port of its own. It has no kubelet (so no Node
// object and no DaemonSet pod): placement needs only the node's Lease, and
// the aggregated API's pod reaches it at the address it advertises, as it
// reaches any node. Killing it is a node lost without warning.
type secondNode struct {
	name     string
	areas    string
	endpoint string
	logFile  string
	cmd      *exec.Cmd
	exited   chan struct{}
	// moved is the agent of the Sandbox the loss moved to the first node.
	moved string
}

var second = &secondNode{}

// lostAfter is the second node's --node-lost-after: its Lease lapses this
// long after its last renewal.
const lostAfter = 12 * time.Second

// The two Sandboxes the second node's specs place; both may move.
var spreadSandboxes = []string{"carol", "dave"}

func (s *secondNode) start(first string) {
	s.name = first + "-second"
	bin := filepath.Join(scratch, "second", "sandbox-controller")
	out, err := run(10*time.Minute, "go", "build", "-o", bin, "./cmd/sandbox-controller")
	Expect(err).NotTo(HaveOccurred(), "building the controller: %s", out)

	// The areas' parents are traversable, as /var/lib is on a node.
	s.areas = filepath.Join(scratch, "second", "areas")
	Expect(os.MkdirAll(s.areas, 0o755)).To(Succeed())
	Expect(os.Chmod(scratch, 0o755)).To(Succeed())
	Expect(os.Chmod(filepath.Dir(s.areas), 0o755)).To(Succeed())

	// The first node's address (the DaemonSet's NODE_IP): the API server's
	// aggregated API reaches the second node's exec API there too.
	ip := strings.TrimSpace(kc("get", "node", first, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`))
	Expect(net.ParseIP(ip)).NotTo(BeNil(), "node %s has no InternalIP", first)
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	Expect(err).NotTo(HaveOccurred())
	s.endpoint = l.Addr().String()
	Expect(l.Close()).To(Succeed())

	s.logFile = filepath.Join(scratch, "second", "controller.log")
	logOut, err := os.Create(s.logFile)
	Expect(err).NotTo(HaveOccurred())
	defer logOut.Close()
	s.cmd = exec.Command(bin,
		"--node-name="+s.name,
		"--areas-root="+s.areas,
		"--backends=bwrap",
		"--system-namespace="+namespace,
		"--node-lost-after="+lostAfter.String(),
		"--api-bind-address="+s.endpoint,
		"--api-advertise-address="+s.endpoint,
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
	)
	s.cmd.Env = os.Environ() // KUBECONFIG: the suite's administrator
	s.cmd.Stdout, s.cmd.Stderr = logOut, logOut
	// Killed with the suite even when the suite is killed (go test's
	// timeout), which runs no AfterAll.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	Expect(s.cmd.Start()).To(Succeed())
	s.exited = make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	GinkgoWriter.Printf("second node %s: pid %d, exec API %s, areas %s\n", s.name, s.cmd.Process.Pid, s.endpoint, s.areas)

	// It has joined when its Lease is renewed.
	Eventually(func(g Gomega) {
		g.Expect(s.running()).To(BeTrue(), "the second node's controller exited:\n%s", s.logTail())
		out, err := run(time.Minute, kubectl, "-n", namespace, "get", "lease", controllers.NodeLeaseName(s.name),
			"-o", "jsonpath={.spec.holderIdentity}", "--ignore-not-found")
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(strings.TrimSpace(out)).To(Equal(s.name))
	}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
}

// spread places two new Sandboxes: the first node holds the sample's, so
// one goes to the second node and the other, the nodes then even, to the
// first. A command run through the API server on each writes into the
// areas of the node it is on.
func (s *secondNode) spread(first string) {
	var manifest strings.Builder
	for _, name := range spreadSandboxes {
		fmt.Fprintf(&manifest, `apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata: {name: %[1]s, namespace: default}
spec:
  agent: %[1]s
  backend: bwrap
  binaries: ["git"]
  onNodeLost: Move
  idleTimeout: 5m
---
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: SessionClaim
metadata: {name: %[1]s-1, namespace: default}
spec:
  sandboxName: %[1]s
  session: "chat-%[1]s"
---
`, name)
	}
	f := filepath.Join(scratch, "spread.yaml")
	Expect(os.WriteFile(f, []byte(manifest.String()), 0o600)).To(Succeed())
	kc("apply", "-f", f)

	placed := map[string]string{}
	Eventually(func(g Gomega) {
		for _, name := range spreadSandboxes {
			placed[name] = strings.TrimSpace(kc("get", "sandbox", name, "-o", "jsonpath={.status.nodeName}"))
			g.Expect(placed[name]).NotTo(BeEmpty(), "Sandbox %s is not placed", name)
		}
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	Expect([]string{placed["carol"], placed["dave"]}).To(ConsistOf(first, s.name), "placement spreads over the two nodes")
	kc("get", "sandboxes", "-o", "wide")

	for _, name := range spreadSandboxes {
		claim := name + "-1"
		kc("wait", "sessionclaim/"+claim, "--for=condition=Ready", "--timeout=3m")
		root, other := areas+"/areas", s.areas
		if placed[name] == s.name {
			root, other = s.areas, areas+"/areas"
			Expect(kc("get", "sessionclaim", claim, "-o", "jsonpath={.status.endpoint}")).To(Equal(s.endpoint))
			// The shortest path, straight to the second node, works too.
			Expect(sandboxExec(claim, []string{"--via", "node"}, "git", "--version")).To(ContainSubstring("git version"))
		}
		// Through the API server: the aggregated API's pod forwards to the
		// node that runs the Sandbox.
		sandboxExec(claim, []string{"--via", "api-server"}, "git", "init", "-q", "/workspace/proof")
		Expect(filepath.Join(root, name, "workspace", "proof", ".git")).To(BeADirectory(), "the command ran on %s", placed[name])
		Expect(filepath.Join(other, name, "workspace", "proof")).NotTo(BeAnExistingFile())
	}
}

// lose kills the second node's controller: after its Lease lapses the
// Sandbox there is NodeLost, moves (onNodeLost: Move) to the first node and
// runs there with that node's areas; its areas on the second node stay.
func (s *secondNode) lose(first string) {
	var moving string
	for _, name := range spreadSandboxes {
		if strings.TrimSpace(kc("get", "sandbox", name, "-o", "jsonpath={.status.nodeName}")) == s.name {
			moving = name
		}
	}
	Expect(moving).NotTo(BeEmpty(), "no Sandbox is on the second node")
	s.stop()
	lostAt := time.Now()

	Eventually(func() string {
		return strings.TrimSpace(kc("get", "sandbox", moving, "-o", "jsonpath={.status.nodeName}"))
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Equal(first), "Sandbox %s moves off the lost node", moving)
	GinkgoWriter.Printf("moved %s to %s %s after the second node stopped (--node-lost-after %s)\n",
		moving, first, time.Since(lostAt).Round(time.Second), lostAfter)
	Expect(kc("get", "events", "--field-selector", "reason=NodeLost,involvedObject.kind=Sandbox,involvedObject.name="+moving,
		"-o", "jsonpath={.items[*].message}")).To(And(ContainSubstring("node "+s.name+" lost"), ContainSubstring("moved to node "+first)))

	claim := moving + "-1"
	firstEndpoint := strings.TrimSpace(kc("get", "sessionclaim", sampleCl, "-o", "jsonpath={.status.endpoint}"))
	Expect(firstEndpoint).NotTo(BeEmpty())
	Eventually(func() string {
		return strings.TrimSpace(kc("get", "sessionclaim", claim, "-o", "jsonpath={.status.endpoint}"))
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(firstEndpoint), "the claim follows its Sandbox")
	kc("wait", "sessionclaim/"+claim, "--for=condition=Ready", "--timeout=2m")
	sandboxExec(claim, nil, "git", "init", "-q", "/workspace/after-move")
	Expect(filepath.Join(areas, "areas", moving, "workspace", "after-move", ".git")).To(BeADirectory())
	// Areas are node-local: what the agent had on the lost node is there,
	// untouched, and was not copied.
	Expect(filepath.Join(s.areas, moving, "workspace", "proof", ".git")).To(BeADirectory())
	Expect(filepath.Join(areas, "areas", moving, "workspace", "proof")).NotTo(BeAnExistingFile())
	s.moved = moving
}

func (s *secondNode) running() bool {
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// stop kills the second node's controller and everything it started, as a
// node that dies does; its areas stay.
func (s *secondNode) stop() {
	if s.running() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			Fail(fmt.Sprintf("the second node's controller (pid %d) did not exit after SIGKILL", s.cmd.Process.Pid))
		}
		GinkgoWriter.Printf("second node %s stopped; its log:\n%s\n", s.name, s.logTail())
	}
	// A node that died (killed here, or by itself) leaves its bwrap trees
	// mounted; these are on this machine, so they go before the suite
	// removes the directory.
	if s.areas != "" {
		Expect(bwrap.DetachTrees(filepath.Join(s.areas, ".runtime", "bwrap"))).To(Succeed())
	}
}

// logTail is the end of the second node's log.
func (s *secondNode) logTail() string {
	b, err := os.ReadFile(s.logFile)
	if err != nil {
		return err.Error()
	}
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return string(b)
}
