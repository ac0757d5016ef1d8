package testharness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// SchedulerPath is kube-scheduler of the same release as envtest's
// kube-apiserver: WITH_SCHEDULER=1 hack/envtest-assets.sh builds it into
// bin/k8s-node/<version>/, beside envtest's bin/k8s/<version>/.
func SchedulerPath() string {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	return filepath.Join(filepath.Dir(filepath.Dir(assets)), "k8s-node", filepath.Base(assets), "kube-scheduler")
}

// Scheduler is a real kube-scheduler run against the suite's API server.
type Scheduler struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	exited chan struct{}
	Log    string
}

// StartScheduler runs kube-scheduler against the suite's API server, as a
// cluster's control plane runs it, until Stop. Missing, it fails under
// CI=true and skips elsewhere.
func (e *Env) StartScheduler() *Scheduler {
	bin := SchedulerPath()
	if _, err := os.Stat(bin); err != nil {
		testenv.Missing(GinkgoT(), "kube-scheduler", "build it with WITH_SCHEDULER=1 hack/envtest-assets.sh (make test does)")
	}
	user, err := e.env.AddUser(envtest.User{Name: "test-scheduler", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	dir := filepath.Join(e.Dir, "kube-scheduler")
	Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
	kc := filepath.Join(dir, "kubeconfig")
	Expect(os.WriteFile(kc, kubeconfig, 0o600)).To(Succeed())
	// It runs until Stop, or the suite's end: the context is its deadline.
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scheduler{Log: filepath.Join(dir, "log"), exited: make(chan struct{}), cancel: cancel}
	out, err := os.Create(s.Log)
	Expect(err).NotTo(HaveOccurred())
	defer out.Close()
	s.cmd = exec.CommandContext(ctx, bin, "--kubeconfig", kc,
		"--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc, "--authentication-skip-lookup",
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "-v=2")
	s.cmd.Stdout, s.cmd.Stderr = out, out
	// Gone with the suite, even when go test's timeout kills it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	Expect(s.cmd.Start()).To(Succeed())
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	return s
}

// Stop kills the scheduler and waits for it.
func (s *Scheduler) Stop() {
	if s == nil || s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.cancel()
	Eventually(s.exited, Timeout).Should(BeClosed())
}

// Running says the scheduler has not exited.
func (s *Scheduler) Running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// StartPlacer runs the placer (controllers.SetupPlacement) in a manager of
// its own with the cache --mode=api gives it, as the aggregated API's
// Deployment does.
func (e *Env) StartPlacer(opts controllers.PlacementOptions) *Manager {
	m := e.newManager(cache.Options{NewInformer: controllers.NewInformerFor(e.Config), ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{controllers.LabelSandboxPod: "true"})},
	}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	run := &Manager{Client: m.GetClient(), cancel: cancel, done: make(chan struct{})}
	Expect(controllers.SetupPlacement(ctx, m, opts)).To(Succeed())
	run.start(ctx, m)
	return run
}
