// Package sandboxtest lets a platform's own envtest suite exercise the
// real controller: CRDs gives envtest.Environment this project's
// CustomResourceDefinitions, and Start runs the controller in the test's
// process against that API server, with the bwrap backend and its exec
// API on 127.0.0.1, as `make run` does. Claims, commands and files then
// work through sandboxclient exactly as on a cluster (directly against
// the controller's exec API, with the envtest user's client certificate).
//
//	env := &envtest.Environment{CRDs: must(sandboxtest.CRDs())}
//	cfg, _ := env.Start()
//	ctrl, _ := sandboxtest.Start(ctx, env, sandboxtest.Options{AreasRoot: t.TempDir()})
//	defer ctrl.Stop()
//
// It needs what the bwrap backend needs: bubblewrap, and root for agent
// identities and resource limits (or Options.AllowUnlimited).
package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/config/crd"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
)

// CRDs are this project's CustomResourceDefinitions, for
// envtest.Environment's CRDs.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(crd.Bases, "bases/*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := crd.Bases.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var c apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, &c)
	}
	return out, nil
}

// Options configure the controller Start runs.
type Options struct {
	// AreasRoot holds the agents' areas (and the runtime's state); it must
	// be a directory of the test's own, removed after the controller stops.
	AreasRoot string
	// AllowUnlimited runs commands without resource limits where no
	// cgroup can be made (a CI without root), with a warning.
	AllowUnlimited bool
	// Log receives the controller's log; default discarded.
	Log logr.Logger
}

// Controller is a controller running in the test's process.
type Controller struct {
	// Endpoint is the exec API's host:port, also published in claims'
	// status.endpoint.
	Endpoint string
	cancel   context.CancelFunc
	done     chan error
}

// Start runs the controller against env's API server until Stop.
func Start(ctx context.Context, env *envtest.Environment, opts Options) (*Controller, error) {
	if opts.AreasRoot == "" {
		return nil, errors.New("sandboxtest: Options.AreasRoot is required")
	}
	cfg := env.Config
	log := opts.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	rt, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(opts.AreasRoot, ".runtime"), AllowUnlimited: opts.AllowUnlimited})
	if err != nil {
		return nil, fmt.Errorf("sandboxtest: the bwrap backend: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.New(cfg, ctrl.Options{Scheme: scheme, Logger: log,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		return nil, err
	}
	ids, err := areas.NewIdentities(opts.AreasRoot, areas.DefaultIDRange)
	if err != nil {
		return nil, err
	}
	home, _ := os.UserHomeDir()
	host := instance.Host{AreasRoot: opts.AreasRoot, Home: home, Identities: ids}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	endpoint := l.Addr().String()
	l.Close()
	certDir := filepath.Join(opts.AreasRoot, ".execapi")
	caFile, certFile, keyFile, err := localcp.ServingCert(certDir)
	if err != nil {
		return nil, err
	}
	if err := localcp.PublishCA(ctx, cfg, servingcert.DefaultNamespace, caFile); err != nil {
		return nil, err
	}
	rts := map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: rt}
	if err := controllers.Setup(ctx, mgr, controllers.Options{Runtimes: rts, Host: host,
		Endpoint: endpoint}); err != nil {
		return nil, err
	}
	apiCfg := execapi.Config{BindAddress: endpoint, CertFile: certFile, KeyFile: keyFile,
		ClientCAFile: filepath.Join(env.ControlPlane.APIServer.CertDir, "client-cert-auth-ca.crt")}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	auth, err := execapi.DelegatingAuth(kube, apiCfg)
	if err != nil {
		return nil, err
	}
	srv, err := execapi.New(apiCfg, execapi.Options{Reader: mgr.GetClient(), Runtimes: rts, Host: host, Auth: auth, Log: log.WithName("execapi")})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(srv); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Controller{Endpoint: endpoint, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- mgr.Start(ctx) }()
	return c, nil
}

// Stop stops the controller and reports how it ended. Delete the
// Sandboxes first to stop their instances.
func (c *Controller) Stop() error {
	c.cancel()
	return <-c.done
}
