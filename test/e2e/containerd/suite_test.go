//go:build e2e

// Package containerd_test runs the controllers over the containerd driver
// against a real API server (envtest) and a real containerd: the daemon
// that `hack/containerd.sh start` runs, named by the variables its `env`
// subcommand prints. Without them the suite skips, and under CI=true it
// fails instead.
package containerd_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/containerd"
	"github.com/cireilclaw/sandbox-controller/testkit/egresstest"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// e2eNamespace keeps the suite's containers apart from anything else on
// the daemon, the driver's own tests included.
const e2eNamespace = "sandbox-controller-e2e"

// Intervals short enough that health and orphan checks happen within a
// test's Eventually.
const (
	healthInterval = 500 * time.Millisecond
	orphanInterval = time.Second
)

var (
	env   *testharness.Env
	k8s   client.Client
	drv   *containerd.Runtime
	image string
	mgr   *testharness.Manager
	// world and networks serve the egress specs: the test's own servers
	// and the Sandboxes' network namespaces and proxies.
	world    *egresstest.World
	networks *egress.Networks
	ctx      = context.Background()
)

func TestContainerd(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "containerd backend suite")
}

var _ = BeforeSuite(func() {
	ce := testenv.ContainerdEnv(GinkgoT(), true)
	drv = newDriver(ce.Address)
	image = importImage(drv, ce.ImageTar)
	env = testharness.Start()
	k8s = env.Client
	if os.Geteuid() != 0 {
		testenv.Missing(GinkgoT(), "root", "network namespaces need root: run the tests as root (CI does)")
	}
	var err error
	world, err = egresstest.New()
	Expect(err).NotTo(HaveOccurred())
	networks = &egress.Networks{Dir: filepath.Join(env.Dir, "netns"), Resolver: world.Resolver()}
	mgr = startManager()
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.Stop()
	}
	if drv != nil {
		// What the specs left (a Sandbox never deleted) goes with the suite.
		states, err := drv.List(ctx)
		Expect(err).NotTo(HaveOccurred())
		for _, st := range states {
			Expect(drv.Delete(ctx, st.Name)).To(Succeed())
		}
		Expect(drv.Close()).To(Succeed())
	}
	if networks != nil {
		networks.Close()
	}
	env.Stop()
	if world != nil {
		world.Close()
	}
})

func newDriver(addr string) *containerd.Runtime {
	d, err := containerd.New(ctx, containerd.Config{Address: addr, Namespace: e2eNamespace, FIFODir: os.Getenv(testenv.ContainerdFIFODirEnv)})
	Expect(err).NotTo(HaveOccurred())
	return d
}

// importImage loads the test image into the suite's namespace; a daemon
// that does not answer is a missing dependency, not a test failure.
func importImage(d *containerd.Runtime, tar string) string {
	f, err := os.Open(tar)
	Expect(err).NotTo(HaveOccurred(), "the test image tarball; build it with hack/test-image.sh")
	defer f.Close()
	names, err := d.Import(ctx, f)
	if runtimes.ReasonOf(err) == runtimes.ReasonUnavailable {
		testenv.Missing(GinkgoT(), "a running containerd: "+err.Error(), testenv.ContainerdHowToStart)
	}
	Expect(err).NotTo(HaveOccurred())
	Expect(names).NotTo(BeEmpty())
	return names[0]
}

// startManager runs the controllers with the containerd driver only.
func startManager() *testharness.Manager {
	return env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendContainerd: drv},
		controllers.Options{HealthInterval: healthInterval, OrphanInterval: orphanInterval, Networks: networks})
}

// repoRoot is the directory holding go.mod, where hack/ is.
func repoRoot() string {
	dir, err := os.Getwd()
	Expect(err).NotTo(HaveOccurred())
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		Expect(parent).NotTo(Equal(dir), "no go.mod above the test directory")
		dir = parent
	}
}

// containerdScript runs hack/containerd.sh with extra environment.
func containerdScript(extraEnv []string, args ...string) {
	cmd, cancel := testenv.Command(5*time.Minute, filepath.Join(repoRoot(), "hack", "containerd.sh"), args...)
	defer cancel()
	cmd.Env = append(os.Environ(), extraEnv...)
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "hack/containerd.sh %v:\n%s", args, out)
}
