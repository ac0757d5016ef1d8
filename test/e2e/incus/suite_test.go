//go:build e2e

// Package incus_test runs the controllers against a real API server
// (envtest) and a real incusd, with the incus driver: the seed's Incus
// sentences, each one checked end to end. Under CI=true a missing incusd or
// test image fails the suite; elsewhere it is skipped with the command that
// sets them up (hack/incus.sh start).
package incus_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

const timeout = testharness.Timeout

var (
	env    *testharness.Env
	k8s    client.Client
	driver *incus.Runtime
	mgr    *testharness.Manager
	image  string
	ctx    = context.Background()
	// world and networks serve the egress specs: the test's own servers
	// and the Sandboxes' proxies.
	world    *egresstest.World
	networks *egress.Networks
)

func TestIncus(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Incus backend suite")
}

const setupHint = "run `hack/incus.sh start` as root (installs incus from bookworm-backports, starts incusd, imports the test image)"

var _ = BeforeSuite(func() {
	var err error
	driver, err = incus.New(incus.Config{StopTimeout: 10 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	if _, err := driver.Client().Server(ctx); err != nil {
		testenv.Missing(GinkgoT(), "incusd", setupHint+": "+err.Error())
	}
	image = os.Getenv("INCUS_TEST_IMAGE")
	if image == "" {
		image = "sandbox-busybox"
	}
	if _, err := driver.Client().GetImageAlias(ctx, image); err != nil {
		testenv.Missing(GinkgoT(), "the incus test image "+image, setupHint+": "+err.Error())
	}
	env = testharness.Start()
	k8s = env.Client
	world, err = egresstest.New()
	Expect(err).NotTo(HaveOccurred())
	networks = &egress.Networks{Dir: filepath.Join(env.Dir, "netns"), Resolver: world.Resolver()}
	mgr = startManager()
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.Stop()
	}
	// The areas live in the suite's scratch directory: the instances that
	// bind them go first, whatever a failed spec left behind. A failure
	// here is reported but does not keep the API server running.
	if driver != nil && env != nil {
		states, err := driver.List(ctx)
		if err != nil {
			GinkgoWriter.Printf("listing instances to clean up: %v\n", err)
		}
		for _, st := range states {
			if strings.HasPrefix(st.Owner, "t-") {
				if err := driver.Delete(ctx, st.Name); err != nil {
					GinkgoWriter.Printf("deleting %s: %v\n", st.Name, err)
				}
			}
		}
	}
	if networks != nil {
		networks.Close()
	}
	env.Stop()
	if world != nil {
		world.Close()
	}
})

// startManager runs the controllers with the suite's incus driver. The
// orphan collector runs at start, so instances a killed earlier run left
// behind are removed before the specs look.
func startManager() *testharness.Manager {
	return env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendIncus: driver},
		controllers.Options{HealthInterval: time.Second, Networks: networks})
}

func rt() *testharness.Recorder { return mgr.Runtimes[v1alpha1.BackendIncus] }

// newSandbox is an incus Sandbox whose agent is named after the namespace,
// so runs never share an instance name.
func newSandbox(ns, name string) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.SandboxSpec{
			Agent:       ns + "-" + name,
			Backend:     v1alpha1.BackendIncus,
			Binaries:    []v1alpha1.BinaryName{"sh", "true", "cat", "id", "sleep", "ps", "touch", "stat"},
			IdleTimeout: &metav1.Duration{Duration: time.Second},
			Incus:       &v1alpha1.IncusSpec{Image: image},
		},
	}
}

func instanceOf(sb *v1alpha1.Sandbox) string { return v1alpha1.InstanceName(sb.Spec.Agent) }

// agentID is the host identity the controller gave the Sandbox's agent: the
// owner of its directory under the areas root, which is the allocation's
// record (made at the first Ensure).
func agentID(sb *v1alpha1.Sandbox) runtimes.Identity {
	// The directory is made first and given to the agent just after.
	var st *syscall.Stat_t
	EventuallyWithOffset(1, func() (uint32, error) {
		fi, err := os.Stat(filepath.Join(env.AreasRoot, sb.Spec.Agent))
		if err != nil {
			return 0, err
		}
		st = fi.Sys().(*syscall.Stat_t)
		return st.Uid, nil
	}, timeout).ShouldNot(BeZero(), "the agent's directory records its identity, never host root")
	return runtimes.Identity{UID: st.Uid, GID: st.Gid}
}

// giveTo hands a host directory tree to the agent of sb, as an
// administrator hands an agent the projects it may change.
func giveTo(sb *v1alpha1.Sandbox, root string) {
	id := agentID(sb)
	ExpectWithOffset(1, testenv.ChownTree(root, id.UID, id.GID)).To(Succeed())
}

func areaPath(sb *v1alpha1.Sandbox, area string) string {
	return filepath.Join(env.AreasRoot, sb.Spec.Agent, area)
}

// run executes a shell script in the instance through the driver, as the
// agent would, and returns its exit code and combined output.
func run(name, script string) (int, string) {
	var out strings.Builder
	st, err := rt().Exec(ctx, name, runtimes.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "exec %q: %s", script, out.String())
	return st.Code, out.String()
}

func inspect(name string) runtimes.State {
	st, err := driver.Inspect(ctx, name)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return st
}

func sandboxStatus(ns, name string) func() (v1alpha1.SandboxStatus, error) {
	return env.SandboxStatus(ns, name)
}

// repoFile is a path in the repository, from this package's directory.
func repoFile(rel string) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "..", rel))
	Expect(err).NotTo(HaveOccurred())
	return p
}

// incusScript runs hack/incus.sh with a subcommand.
func incusScript(sub string) {
	cmd := exec.Command(repoFile("hack/incus.sh"), sub)
	out, err := cmd.CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "hack/incus.sh %s: %s", sub, out)
}

// startedByScript says whether the running incusd is the one
// hack/incus.sh started, which is the only one the suite may kill.
func startedByScript() bool {
	out, err := exec.Command(repoFile("hack/incus.sh"), "env").Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if pidfile, ok := strings.CutPrefix(line, "export INCUS_PIDFILE="); ok {
			b, err := os.ReadFile(pidfile)
			if err != nil {
				return false
			}
			exe, err := os.Readlink("/proc/" + strings.TrimSpace(string(b)) + "/exe")
			return err == nil && exe == "/usr/libexec/incus/incusd"
		}
	}
	return false
}

// rawClient is the REST client alone, for setting up what the specs need
// (projects, files) and for the benchmark's baselines.
func rawClient() *incusapi.Client { return driver.Client() }
