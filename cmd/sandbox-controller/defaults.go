package main

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/lazylog"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// version is set at link time (-X main.version=...) by `make image`; a
// plain `go build` falls back to what the Go toolchain recorded.
var version string

// defaultGCPercent is --gc-percent's default. Measured with make
// bench-scale (docs/benchmarks-scale.md): at a thousand Sandboxes, 50
// instead of Go's 100 took the controller's peak memory down by about 6
// MiB, with no CPU difference beyond the noise.
const defaultGCPercent = 50

// setGCPercent sets the garbage collection target from --gc-percent,
// unless GOGC is set (then the runtime has taken it already).
func setGCPercent(percent int, gogc string) error {
	if percent < -1 || percent == 0 {
		return fmt.Errorf("--gc-percent=%d: must be 1 or more, or -1 for no collection", percent)
	}
	if gogc == "" {
		debug.SetGCPercent(percent)
	}
	return nil
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
		if bi.Main.Version != "" {
			return bi.Main.Version
		}
	}
	return "unknown"
}

// loggerOptions turns --log-format and --log-level into zap options. The
// defaults are for production (JSON, info, RFC 3339 times a log collector
// parses); console keeps the development mode a person reads at a terminal.
// Either way a logger's fields are encoded when it first writes.
func loggerOptions(format, level string) ([]zap.Opts, error) {
	var opts []zap.Opts
	switch format {
	case "json":
		opts = append(opts, zap.UseDevMode(false), zap.JSONEncoder())
	case "console":
		opts = append(opts, zap.UseDevMode(true), zap.ConsoleEncoder())
	default:
		return nil, fmt.Errorf("--log-format: %q is neither json nor console", format)
	}
	lvl, err := parseLogLevel(level)
	if err != nil {
		return nil, err
	}
	// A reconciler's pass gets a logger with five fields; they are encoded
	// only if the pass logs (internal/lazylog).
	return append(opts, zap.Level(lvl), zap.RawZapOpts(uberzap.WrapCore(lazylog.Wrap))), nil
}

// parseLogLevel maps a level name or a logr verbosity N to zap's level;
// logr's V(N) is zap's level -N.
func parseLogLevel(level string) (zapcore.Level, error) {
	switch level {
	case "error":
		return zapcore.ErrorLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "debug":
		return zapcore.DebugLevel, nil
	}
	n, err := strconv.Atoi(level)
	if err != nil || n < 0 || n > 127 {
		return 0, fmt.Errorf("--log-level: %q is not error, info, debug or a verbosity from 0 to 127", level)
	}
	return zapcore.Level(-n), nil
}

// cacheOptions are the informer caches' options. Watches resume within
// about half a second of an API server outage (controllers.NewInformerFor).
// Managed fields are dropped before an object is stored: the controller
// never reads them, and at a thousand Sandboxes and claims they are a large
// share of the cache. Dropping them is safe for writes too: an Update
// whose managedFields are unset keeps the server's. The
// last-applied-configuration annotation is kept although it is never read:
// the controllers Update whole objects, and an Update without it would
// remove it from the server, breaking the next `kubectl apply`. The
// strings many Sandboxes and claims hold alike (conditions, finalizer,
// namespace) are kept once (controllers.CacheTransform).
func cacheOptions(cfg *rest.Config) cache.Options {
	return cache.Options{
		NewInformer:      controllers.NewInformerFor(cfg),
		DefaultTransform: controllers.CacheTransform(),
		// Only the Sandboxes' Pods (the placer's, --mode=api), not every
		// Pod of the cluster.
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{controllers.LabelSandboxPod: "true"})},
			// Only the requests of the nodes' signer (--mode=api), not every
			// CertificateSigningRequest anyone makes.
			&certv1.CertificateSigningRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", servingcert.SignerName)},
		},
	}
}

// checkPlacementFlags refuses placement flags no cluster could work with,
// naming the flag and the rule (0 or less would otherwise quietly mean
// the default).
func checkPlacementFlags(lostAfter time.Duration, podImage string) error {
	if lostAfter < time.Second {
		return fmt.Errorf("--node-lost-after=%s: must be a second or more (a Pod tolerates a taint for whole seconds)", lostAfter)
	}
	if podImage == "" {
		return errors.New("--sandbox-pod-image: must name an image (the pause image the nodes hold)")
	}
	return nil
}

// managerScheme is the types both modes read and write: Kubernetes' own
// and the project's.
func managerScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// addProbes serves /healthz and /readyz on the manager's probe address.
func addProbes(mgr ctrl.Manager) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("readyz", healthz.Ping)
}
