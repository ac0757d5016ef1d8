package v1alpha1_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

var (
	env *envtest.Environment
	cfg *rest.Config
	k8s client.Client
	ctx = context.Background()
)

func TestAdmission(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Admission rules (CEL) suite")
}

var _ = BeforeSuite(func() {
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(GinkgoT(), "envtest binaries", p)
	}
	env = &envtest.Environment{CRDDirectoryPaths: []string{testenv.CRDDir(2)}, ErrorIfCRDPathMissing: true}
	var err error
	cfg, err = localcp.StartEnvironment(env)
	Expect(err).NotTo(HaveOccurred())
	scheme := runtime.NewScheme()
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
