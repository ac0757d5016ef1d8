// Command sandbox-controller is the manager: it reconciles Sandboxes and
// SessionClaims against the runtimes enabled on this node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/egress"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
)

type flags struct {
	areasRoot, stateDir, nodeName, backends string
	drivers                                 map[v1alpha1.Backend]runtimes.Constructor
	agentIDs                                string
	sandboxWorkers, claimWorkers            int
	metricsAddr, probeAddr, pprofAddr       string
	leaderElect                             bool
	routineEvents                           bool
	local                                   bool
	localAssets, localCRDs, localKubeconfig string
	api                                     execapi.Config
	apiAdvertise                            string
	podImage                                string
	holderImage                             string
	podCgroups                              string
	nodeServiceAccount                      string
	nodeLostAfter                           time.Duration
	systemNamespace                         string
	certValidity                            time.Duration
	apiService                              string
	mode                                    string
	egress                                  egressFlags
}

// egressFlags bound every egress proxy of the node.
type egressFlags struct {
	maxConns       int
	maxConnsTotal  int
	idleTimeout    time.Duration
	bytesPerSecond resource.Quantity
	internalNets   string
}

// internal parses --egress-internal-networks.
func (e egressFlags) internal() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(e.internalNets, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--egress-internal-networks: %q is not an address range in CIDR notation (10.96.0.0/12)", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// defaultEgressMaxConnsTotal bounds the egress connections of all the
// Sandboxes a controller serves: 8,192 connections hold 16,384
// descriptors, within the limit a controller's container or unit has.
const defaultEgressMaxConnsTotal = 8192

// check names the flag that is out of range.
func (e egressFlags) check() error {
	switch {
	case e.maxConns < 1:
		return fmt.Errorf("--egress-max-connections=%d: at least 1", e.maxConns)
	case e.maxConnsTotal < 0:
		return fmt.Errorf("--egress-max-connections-total=%d: 0 (no bound) or more", e.maxConnsTotal)
	case e.idleTimeout < time.Second:
		return fmt.Errorf("--egress-idle-timeout=%s: at least 1s", e.idleTimeout)
	case e.bytesPerSecond.Sign() != 0 && e.bytesPerSecond.Value() < 1024:
		return fmt.Errorf("--egress-bandwidth=%s: 0 (no bound) or at least 1Ki bytes a second", e.bytesPerSecond.String())
	}
	_, err := e.internal()
	return err
}

func main() {
	var f flags
	flag.StringVar(&f.mode, "mode", modeNode, "node: a node's controller (the DaemonSet: reconciles, runs sandboxes, serves the exec API on the node); api: the aggregated API's own server (a Deployment: forwards the API server's requests to the nodes, holds the forwarder CA no node can read)")
	flag.StringVar(&f.areasRoot, "areas-root", "/var/lib/sandbox-controller/areas", "host directory holding one directory of areas per agent (<areas-root>/<agent>/{workspace,memories,blocks,skills,tasks}); never deleted by the controller")
	flag.StringVar(&f.agentIDs, "agent-ids", areas.DefaultIDRange.String(), "FIRST:COUNT host user and group ids agents are given, one per agent (recorded as the owner of <areas-root>/<agent>); agent commands never run as host root, so the range may not include 0")
	flag.StringVar(&f.stateDir, "state-dir", "", "host directory for runtime state (default <areas-root>/.runtime)")
	flag.IntVar(&f.sandboxWorkers, "sandbox-workers", 4, "Sandboxes reconciled at once (a Sandbox is never reconciled twice at once)")
	flag.IntVar(&f.claimWorkers, "claim-workers", 16, "SessionClaims reconciled at once; bursts of claims bind this many at a time")
	flag.StringVar(&f.nodeName, "node-name", "", "this node's name: reconcile the Sandboxes pinned (spec.nodeName) or placed (status.nodeName) here; empty (one machine) reconciles only Sandboxes that are neither")
	flag.StringVar(&f.nodeServiceAccount, "node-service-account", "sandbox-controller", "with --mode=api: the ServiceAccount (in --system-namespace) the nodes' controllers run as: the aggregated API signs a node's exec API serving certificate only for it, and only for the node its token is bound to")
	flag.StringVar(&f.podCgroups, "pod-cgroups", "", "with --node-name on a cluster: where the node's cgroup hierarchies are mounted in this process (a hostPath of the node's /sys/fs/cgroup, as config/manager mounts it): each Sandbox's processes run below the cgroup of its Pod (status.pod), so that the kubelet accounts for them (eviction, its summary API, kubectl top pod); empty: below the backends' own cgroup parents")
	flag.DurationVar(&f.nodeLostAfter, "node-lost-after", controllers.DefaultNodeLostAfter, "with --mode=api: how long the Pod of an onNodeLost: Move Sandbox tolerates its node being not ready or unreachable before it is evicted and the Sandbox is scheduled elsewhere (whole seconds)")
	flag.StringVar(&f.holderImage, "holder-image", os.Getenv("SANDBOX_HOLDER_IMAGE"), "with --mode=api: the image the Pod of a bwrap Sandbox with spec.bwrap.image copies the holder ("+controllers.HolderPath+") from: the controller's own image (default $SANDBOX_HOLDER_IMAGE, else the image of this process's own Pod)")
	flag.StringVar(&f.podImage, "sandbox-pod-image", envOr("SANDBOX_POD_IMAGE", controllers.DefaultPodImage), "with --mode=api: the image of the Pod each Sandbox gets, which only holds its place on a node: the pause image the nodes already hold (default $SANDBOX_POD_IMAGE, else "+controllers.DefaultPodImage+")")
	flag.StringVar(&f.systemNamespace, "system-namespace", envOr("POD_NAMESPACE", controllers.DefaultSystemNamespace), "the controller's own namespace (default $POD_NAMESPACE, else "+controllers.DefaultSystemNamespace+"): the node controllers' pods, the exec API's CA (Secret and ConfigMap sandbox-controller-ca); every node's controller must use the same")
	f.drivers = bindBackendFlags(flag.CommandLine)
	flag.StringVar(&f.backends, "backends", "bwrap", "comma-separated backends to enable on this node, of those this build links: "+driverList(f.drivers))
	flag.StringVar(&f.pprofAddr, "pprof-bind-address", "0", "address Go's profiler (net/http/pprof: /debug/pprof/profile, /heap, ...) binds to, for measuring the controller (make bench-scale PPROF=1); keep it on loopback, it serves anyone who reaches it; 0 (the default) disables it")
	flag.StringVar(&f.metricsAddr, "metrics-bind-address", "127.0.0.1:8080", "address the metrics endpoint binds to (loopback by default: the controller runs on the node's network, and its metrics name tenants' objects); 0 disables it")
	flag.StringVar(&f.probeAddr, "health-probe-bind-address", "127.0.0.1:8081", "address the health and readiness probes bind to (loopback by default, where the node's kubelet probes a host-network pod); 0 disables them")
	flag.BoolVar(&f.routineEvents, "routine-events", false, "also record a Normal event each time an instance starts or stops idle (the Sandbox's Ready condition says so either way; each event is one more API write, a fifth of the controller's at a thousand Sandboxes); Warning events are always recorded")
	flag.BoolVar(&f.leaderElect, "leader-elect", false, "elect a leader so only one replica reconciles at a time")
	flag.BoolVar(&f.local, "local-control-plane", false, "start a throw-away local kube-apiserver and etcd with the CRDs installed and run against it (for trying the controller; data is lost on exit)")
	flag.StringVar(&f.localAssets, "local-assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory with the kube-apiserver and etcd binaries for --local-control-plane (default $KUBEBUILDER_ASSETS)")
	flag.StringVar(&f.localCRDs, "local-crds", "config/crd/bases", "CRD directory installed by --local-control-plane")
	flag.StringVar(&f.localKubeconfig, "local-kubeconfig", "bin/local/kubeconfig", "where --local-control-plane writes its administrator kubeconfig")
	f.api.BindFlags(flag.CommandLine)
	flag.DurationVar(&f.certValidity, "api-cert-validity", servingcert.DefaultValidity, "validity of the exec API's serving certificate when it comes from the cluster's CA; it is renewed at two thirds")
	flag.StringVar(&f.apiService, "api-service", "sandbox-controller-exec-api", "Service in --system-namespace that APIService "+execapi.APIServiceName+" points at, served by --mode=api (which names it in its certificate and sets the APIService's caBundle); a node then takes forwarded requests only from the forwarder CA that --mode=api publishes, and reads the exec API's CA that it makes; empty: the exec API is reached on the nodes only, and a node makes the CA itself")
	flag.StringVar(&f.apiAdvertise, "api-advertise-address", "", "host:port of the exec API that SessionClaims publish in status.endpoint (in a DaemonSet: the node IP and the API port); empty publishes none")
	flag.IntVar(&f.egress.maxConns, "egress-max-connections", egress.DefaultMaxConns, "connections one Sandbox's egress proxy serves at once (spec.network.egress Allowlist); more are refused")
	flag.IntVar(&f.egress.maxConnsTotal, "egress-max-connections-total", defaultEgressMaxConnsTotal, "connections all the Sandboxes' egress proxies of this controller serve at once, together (each holds two of the controller's descriptors), of which the Sandboxes of one namespace may hold three quarters, and the last quarter goes to namespaces holding fewer than are free; more are refused; 0 for no bound")
	flag.DurationVar(&f.egress.idleTimeout, "egress-idle-timeout", egress.DefaultIdleTimeout, "an egress connection that moves no byte this long is closed")
	flag.StringVar(&f.egress.internalNets, "egress-internal-networks", "", "comma-separated address ranges (CIDR) egress proxies treat as internal, beyond loopback, link-local, private and shared ones: a cluster's service and pod ranges where they are not private; a SandboxClass's allowedEgressNetworks still opens them (never this node's own addresses or loopback, which no proxy connects to)")
	flag.Var(quantityFlag{&f.egress.bytesPerSecond}, "egress-bandwidth", "bytes a second one Sandbox's egress proxy moves, each way, all its connections together (a quantity: 10Mi); 0 for no bound")
	logFormat := flag.String("log-format", "json", "log encoding: json (one object a line, for log collectors) or console (human-readable, with stack traces from warnings on: the development mode `make run` uses)")
	logLevel := flag.String("log-level", "info", "least important log lines written: error, info, debug, or a number N for logr's V(N) and below (steady-state lines are V(4))")
	gcPercent := flag.Int("gc-percent", defaultGCPercent, "Go's garbage collection target (as GOGC): a collection starts when the heap has grown this many percent beyond what the last one left live; the controller's heap is mostly its caches of Sandboxes and claims, and the default keeps its peak memory lower than Go's own 100 does, by collecting more often; -1 turns collection off; GOGC in the environment, when set, wins")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("sandbox-controller", buildVersion())
		return
	}
	if err := setGCPercent(*gcPercent, os.Getenv("GOGC")); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-controller:", err)
		os.Exit(2)
	}
	if err := f.egress.check(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-controller:", err)
		os.Exit(2)
	}
	if err := checkPlacementFlags(f.nodeLostAfter, f.podImage); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-controller:", err)
		os.Exit(2)
	}
	logOpts, err := loggerOptions(*logFormat, *logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-controller:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(logOpts...))

	runMode := run
	switch f.mode {
	case modeNode:
	case modeAPI:
		runMode = runAggregatedAPI
	default:
		fmt.Fprintf(os.Stderr, "sandbox-controller: --mode=%s: must be %s or %s\n", f.mode, modeNode, modeAPI)
		os.Exit(2)
	}
	if err := runMode(ctrl.SetupSignalHandler(), f); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-controller:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) (retErr error) {
	log := ctrl.Log.WithName("setup")
	areasRoot, err := filepath.Abs(f.areasRoot)
	if err != nil {
		return fmt.Errorf("--areas-root: %w", err)
	}
	stateDir := f.stateDir
	if stateDir == "" {
		stateDir = filepath.Join(areasRoot, ".runtime")
	}
	if stateDir, err = filepath.Abs(stateDir); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	rts, closeBackends, err := enableBackends(ctx, f, stateDir)
	if err != nil {
		return err
	}
	defer closeBackends()

	var cfg *rest.Config
	if f.local {
		cp, err := localcp.Start(f.localAssets, f.localCRDs, f.localKubeconfig)
		if err != nil {
			return err
		}
		defer func() {
			log.Info("stopping the local control plane")
			retErr = errors.Join(retErr, cp.Stop())
		}()
		cfg = cp.Config
		if err := installPermissiveClass(ctx, cfg); err != nil {
			return err
		}
		kc, _ := filepath.Abs(cp.Kubeconfig)
		// The local control plane has no aggregator routing to this
		// process: its exec API is reached directly.
		f.apiService = ""
		var apiCA string
		if f.api.Enabled() && f.api.CertFile == "" {
			dir := filepath.Join(filepath.Dir(kc), "execapi")
			if apiCA, f.api.CertFile, f.api.KeyFile, err = localcp.ServingCert(dir); err != nil {
				return err
			}
			if f.api.ClientCAFile == "" {
				f.api.ClientCAFile = cp.ClientCAFile()
			}
			if f.apiAdvertise == "" {
				_, port, _ := net.SplitHostPort(f.api.BindAddress)
				f.apiAdvertise = net.JoinHostPort("127.0.0.1", port)
			}
			if err := localcp.PublishCA(ctx, cfg, f.systemNamespace, apiCA); err != nil {
				return err
			}
		}
		caNote := ""
		if apiCA != "" {
			caNote = fmt.Sprintf("The exec API's CA is %s, published in ConfigMap %s/%s.\n", apiCA, f.systemNamespace, servingcert.ConfigMapName)
		}
		fmt.Fprintf(os.Stderr, `
Local control plane is up (CRDs installed). In another shell:

  export KUBECONFIG=%s
  kubectl apply -f config/samples/
  kubectl get sandboxes,sessionclaims -w
  kubectl sandbox exec alice-session-1 -- git --version

(make install-plugin puts kubectl-sandbox in bin/.) Agent areas live in %s.
A permissive default SandboxClass "default" is installed: Sandboxes may
mount any host directory and use any device, backend and image, as without
classes. For several teams, see "Running it for several teams" in README.md.
Ctrl-C stops the controller and the control plane.
%s
`, kc, areasRoot, caNote)
	} else if cfg, err = ctrl.GetConfig(); err != nil {
		return fmt.Errorf("finding the cluster (kubeconfig or in-cluster config): %w", err)
	}

	scheme, err := managerScheme()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: f.metricsAddr},
		HealthProbeBindAddress: f.probeAddr,
		PprofBindAddress:       f.pprofAddr,
		LeaderElection:         f.leaderElect,
		LeaderElectionID:       "sandbox-controller.cireilclaw.dev",
		Cache:                  cacheOptions(cfg),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	home, _ := os.UserHomeDir()
	idRange, err := areas.ParseIDRange(f.agentIDs)
	if err != nil {
		return fmt.Errorf("--agent-ids: %w", err)
	}
	ids, err := areas.NewIdentities(areasRoot, idRange)
	if err != nil {
		return fmt.Errorf("--agent-ids: %w", err)
	}
	host := instance.Host{AreasRoot: areasRoot, Home: home, Identities: ids}
	// Egress allowlists need network namespaces, which only root makes.
	var networks *egress.Networks
	if os.Geteuid() == 0 {
		networks = &egress.Networks{Dir: filepath.Join(stateDir, "netns"), MaxConns: f.egress.maxConns, Shared: egress.NewSlots(f.egress.maxConnsTotal),
			IdleTimeout: f.egress.idleTimeout, BytesPerSecond: f.egress.bytesPerSecond.Value()}
		// Checked at start (egressFlags.check).
		networks.InternalNets, _ = f.egress.internal()
		if err := networks.RefuseHostAddresses(); err != nil {
			return err
		}
		host.NetnsDir = networks.Dir
		// The namespaces stay for the next start to adopt; their proxies
		// stop with this process.
		defer networks.Close()
	}
	var podCgroups controllers.PodCgroupFinder
	if f.podCgroups != "" {
		if f.nodeName == "" {
			return fmt.Errorf("--pod-cgroups needs --node-name: Sandboxes have Pods on a cluster only")
		}
		podCgroups = cgroup.NewPods(f.podCgroups)
	}
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		Networks:       networks,
		PodCgroups:     podCgroups,
		PodCgroupRoot:  f.podCgroups,
		Runtimes:       rts,
		Host:           host,
		NodeName:       f.nodeName,
		Endpoint:       f.apiAdvertise,
		SandboxWorkers: f.sandboxWorkers,
		ClaimWorkers:   f.claimWorkers,
		RoutineEvents:  f.routineEvents,
	}); err != nil {
		return err
	}
	if f.api.Enabled() {
		var certs *servingcert.Source
		if f.api.CertFile == "" {
			if certs, err = clusterCertificate(ctx, cfg, scheme, f); err != nil {
				return err
			}
			if err := mgr.Add(certs); err != nil {
				return err
			}
		}
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("exec API: %w", err)
		}
		// On a cluster, client certificates the API server accepts work on
		// the nodes' endpoints too (kubectl sandbox exec --via node).
		f.api.ClusterClientCA = f.apiService != "" && f.api.ClientCAFile == ""
		auth, err := execapi.DelegatingAuth(kube, f.api)
		if err != nil {
			return fmt.Errorf("exec API: %w", err)
		}
		opts := execapi.Options{
			Reader: mgr.GetClient(), Runtimes: rts, Host: host, NodeName: f.nodeName,
			Log: ctrl.Log.WithName("execapi"),
		}
		if f.apiService != "" {
			// Requests through the API server reach this node from the
			// aggregated API, which alone holds the forwarder CA's key.
			if err := execapi.PeerAuthFromConfigMap(kube, f.systemNamespace, servingcert.ForwarderConfigMapName, servingcert.ForwarderName,
				ctrl.Log.WithName("execapi"), &auth); err != nil {
				return fmt.Errorf("exec API: %w", err)
			}
		}
		if certs != nil {
			opts.GetCertificate = certs.GetCertificate
		}
		opts.Auth = auth
		srv, err := execapi.New(f.api, opts)
		if err != nil {
			return fmt.Errorf("exec API: %w", err)
		}
		if err := mgr.Add(srv); err != nil {
			return err
		}
	}
	if err := addProbes(mgr); err != nil {
		return err
	}
	log.Info("starting manager", "areasRoot", areasRoot, "backends", f.backends, "node", f.nodeName)
	logCgroupStarts(log, rts)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// clusterCertificate is the exec API's serving certificate from the
// cluster's CA, for the address clients are told (status.endpoint) and
// the node's name.
func clusterCertificate(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, f flags) (*servingcert.Source, error) {
	host, _, err := net.SplitHostPort(f.apiAdvertise)
	if err != nil || host == "" {
		return nil, fmt.Errorf("the exec API takes its certificate from the cluster's CA, which must name the address clients reach it at: set --api-advertise-address host:port (%q), or give --api-tls-cert-file", f.apiAdvertise)
	}
	hosts := []string{host}
	if f.nodeName != "" && f.nodeName != host {
		hosts = append(hosts, f.nodeName)
	}
	// Straight to the API server: the manager's cache would watch every
	// Secret of the cluster.
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	// Next to the aggregated API the node asks it for the certificate and
	// never reads the CA's key.
	src := &servingcert.Source{Client: c, Namespace: f.systemNamespace, Hosts: hosts, Validity: f.certValidity,
		Request: f.apiService != "", Node: f.nodeName, Log: ctrl.Log.WithName("servingcert")}
	if src.Request && f.nodeName == "" {
		return nil, errors.New("the aggregated API signs a node's serving certificate for its node: set --node-name, or give --api-tls-cert-file")
	}
	loadCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := src.Load(loadCtx); err != nil {
		return nil, fmt.Errorf("exec API serving certificate: %w", err)
	}
	return src, nil
}

// quantityFlag is a flag holding a Kubernetes quantity ("10Mi").
type quantityFlag struct{ q *resource.Quantity }

func (f quantityFlag) String() string {
	if f.q == nil {
		return "0"
	}
	return f.q.String()
}

func (f quantityFlag) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a quantity (such as 10Mi or 500Ki): %w", s, err)
	}
	if q.Sign() < 0 {
		return fmt.Errorf("%q is below zero", s)
	}
	*f.q = q
	return nil
}
