// Package localcp runs a throw-away local control plane (a real
// kube-apiserver and etcd, the binaries envtest uses) with the project's
// CRDs installed, for `make run` and for trying the controller without a
// cluster. It is not for production: its data lives in a temporary
// directory and goes when it stops.
package localcp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControlPlane is a running local control plane.
type ControlPlane struct {
	env *envtest.Environment
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for kubectl.
	Kubeconfig string
}

// Start starts kube-apiserver and etcd from assetsDir, installs the CRDs in
// crdDir and writes an administrator kubeconfig to kubeconfigPath.
func Start(assetsDir, crdDir, kubeconfigPath string) (*ControlPlane, error) {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assetsDir, b)); err != nil {
			return nil, fmt.Errorf("local control plane: %s not found in %q: build it with hack/envtest-assets.sh (make envtest)", b, assetsDir)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assetsDir,
		CRDDirectoryPaths:     []string{crdDir},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := StartEnvironment(env)
	if err != nil {
		return nil, fmt.Errorf("starting the local control plane: %w", err)
	}
	cp := &ControlPlane{env: env, Config: cfg, Kubeconfig: kubeconfigPath}
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = cp.Stop()
		return nil, fmt.Errorf("creating the local administrator: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		_ = cp.Stop()
		return nil, fmt.Errorf("writing the local kubeconfig: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfigPath), 0o755); err != nil {
		_ = cp.Stop()
		return nil, fmt.Errorf("writing the local kubeconfig: %w", err)
	}
	if err := writeNew(kubeconfigPath, kc, 0o600); err != nil {
		_ = cp.Stop()
		return nil, fmt.Errorf("writing the local kubeconfig: %w", err)
	}
	return cp, nil
}

// StartEnvironment starts env, and stops what it started when it fails:
// envtest's own Start returns an error after kube-apiserver and etcd came
// up (CRDs or webhooks that do not install, a default namespace that does
// not appear) and leaves both running, with their data, past the process
// that asked for them.
func StartEnvironment(env *envtest.Environment) (*rest.Config, error) {
	cfg, err := env.Start()
	if err != nil {
		if stopErr := env.Stop(); stopErr != nil {
			return nil, errors.Join(err, fmt.Errorf("stopping what started: %w", stopErr))
		}
		return nil, err
	}
	return cfg, nil
}

// Stop stops the API server and etcd and removes their data.
func (cp *ControlPlane) Stop() error {
	return cp.env.Stop()
}
