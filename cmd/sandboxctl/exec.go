package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/exec"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/exectoken"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// refusedPrefix starts the message of a command the policy refused; the
// exec API sends it on the status channel and nothing ran.
const refusedPrefix = "command refused"

// clusterFlags select the cluster, the claim's namespace and the exec API.
type clusterFlags struct {
	kubeconfig, context, namespace string
	server, caFile                 string
	audience, tokenFile            string
	systemNamespace                string
	insecure                       bool
	via                            string
	// as and asGroups impersonate, and requestTimeout bounds each request
	// to the API server, as kubectl's flags of the same names do.
	as             string
	asGroups       stringList
	requestTimeout string
}

// stringList is a flag that may be given several times.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// How a client reaches the exec API (--via).
const (
	viaAPIServer = "api-server"
	viaNode      = "node"
)

func (f *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "the kubeconfig whose credentials are used (default $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&f.context, "context", "", "the kubeconfig context to use")
	fs.StringVar(&f.namespace, "n", "", "the claim's namespace (default the context's namespace)")
	fs.StringVar(&f.namespace, "namespace", "", "the claim's namespace (default the context's namespace)")
	fs.StringVar(&f.via, "via", "", "how to reach the claim's sandbox: api-server (the aggregated API "+execapi.AggregatedGroup+", with the kubeconfig's own credentials, from anywhere kubectl works) or node (the exec API of the Sandbox's node, the claim's status.endpoint); default api-server when the API server serves that API, else node")
	fs.StringVar(&f.server, "server", "", "the exec API's address (https://host:port); default the endpoint in the claim's status")
	fs.StringVar(&f.caFile, "api-ca-file", "", "CA bundle that signed the exec API's serving certificate (default: the cluster's exec API CA, published in ConfigMap "+servingcert.ConfigMapName+" of --system-namespace; without one, the kubeconfig's CA)")
	fs.StringVar(&f.systemNamespace, "system-namespace", servingcert.DefaultNamespace, "the controller's namespace, where the exec API's CA is published")
	fs.BoolVar(&f.insecure, "insecure-skip-tls-verify", false, "do not verify the exec API's serving certificate (testing only)")
	fs.StringVar(&f.audience, "api-audience", execapi.DefaultAudience, "the audience the exec API accepts tokens for (its --api-audience)")
	fs.StringVar(&f.as, "as", "", "username to impersonate for the operation (as kubectl --as)")
	fs.Var(&f.asGroups, "as-group", "group to impersonate for the operation; repeat for several (as kubectl --as-group)")
	fs.StringVar(&f.requestTimeout, "request-timeout", "", "how long to wait for one request to the API server before giving up, e.g. 30s (as kubectl --request-timeout); empty waits as long as it takes")
	fs.StringVar(&f.tokenFile, "api-token-file", "", "a bearer token issued for --api-audience (e.g. from your identity provider) to send instead of the kubeconfig's credentials")
}

// apiConfig builds the client configuration for the claim's exec API and
// the base URL of its paths (up to /namespaces). Through the API server it
// is the kubeconfig's own, credentials and CA, aimed at the aggregated API.
// To a node it is aimed at the endpoint the claim publishes and never
// forwards a credential the API server accepts as its own: a client
// certificate is sent as it is, a service account token is exchanged for
// one bound to the exec API's audience (exectoken.ForExecAPI).
func (f *clusterFlags) apiConfig(ctx context.Context, claim string) (*rest.Config, string, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	if t := f.requestTimeout; t != "" {
		if _, err := strconv.Atoi(t); err != nil {
			if _, err := time.ParseDuration(t); err != nil {
				return nil, "", "", fmt.Errorf("--request-timeout %q: give seconds or a duration such as 30s or 2m", t)
			}
		}
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: f.context, Timeout: f.requestTimeout}
	overrides.AuthInfo.Impersonate, overrides.AuthInfo.ImpersonateGroups = f.as, f.asGroups
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", "", fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns := f.namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", "", fmt.Errorf("finding the namespace: %w", err)
		}
	}
	via := f.via
	switch {
	case via == viaAPIServer || via == viaNode:
	case via != "":
		return nil, "", "", fmt.Errorf("--via %q: use %s or %s", via, viaAPIServer, viaNode)
	case f.server != "":
		via = viaNode
	case aggregatedServed(cfg):
		via = viaAPIServer
	default:
		via = viaNode
	}
	if via == viaAPIServer {
		if f.server != "" {
			return nil, "", "", errors.New("--server names a node's exec API; it does not go with --via " + viaAPIServer)
		}
		return cfg, ns, strings.TrimSuffix(cfg.Host, "/") + execapi.AggregatedPrefix, nil
	}
	server := f.server
	if server == "" {
		if server, err = claimEndpoint(ctx, cfg, ns, claim); err != nil {
			return nil, "", "", err
		}
	}
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	api, err := exectoken.ForExecAPI(ctx, cfg, f.audience, f.tokenFile)
	if err != nil {
		return nil, "", "", err
	}
	api.Host, api.APIPath = server, ""
	switch {
	case f.insecure:
		api.Insecure, api.CAFile, api.CAData = true, "", nil
	case f.caFile != "":
		api.CAFile, api.CAData = f.caFile, nil
	default:
		ca, err := publishedCA(ctx, cfg, f.systemNamespace)
		if err != nil {
			return nil, "", "", err
		}
		if ca != nil {
			api.CAFile, api.CAData = "", ca
		}
	}
	return api, ns, strings.TrimSuffix(server, "/") + "/api/v1alpha1", nil
}

// aggregatedServed reports whether the API server serves the aggregated
// exec API: its discovery answers only while the APIService is Available.
// Asked with a deadline; an answer other than "not served" (the API
// server unreachable, discovery refused) is said on stderr before the
// node path is taken, so a switch of path is never silent.
func aggregatedServed(cfg *rest.Config) bool {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 10 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false
	}
	gv := execapi.AggregatedGroup + "/" + execapi.AggregatedVersion
	res, err := kube.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "sandboxctl: asking the API server whether it serves %s: %v; using the node's exec API (--via %s)\n", gv, err, viaNode)
		}
		return false
	}
	for _, r := range res.APIResources {
		if r.Name == "sessionclaims/exec" {
			return true
		}
	}
	return false
}

// publishedCA is the exec API's CA the controllers publish, or nil when
// the cluster has none (its exec APIs were given certificates of their
// own, and the kubeconfig's CA or --api-ca-file is to be used).
func publishedCA(ctx context.Context, cfg *rest.Config, namespace string) ([]byte, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cm, err := kube.CoreV1().ConfigMaps(namespace).Get(ctx, servingcert.ConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the exec API's CA (ConfigMap %s/%s; or give --api-ca-file): %w", namespace, servingcert.ConfigMapName, err)
	}
	ca, err := servingcert.CAOf(cm)
	if err != nil {
		return nil, fmt.Errorf("%w; give --api-ca-file", err)
	}
	return ca, nil
}

// claimEndpoint reads status.endpoint of the SessionClaim.
func claimEndpoint(ctx context.Context, cfg *rest.Config, ns, claim string) (string, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	gvr := v1alpha1.GroupVersion.WithResource("sessionclaims")
	obj, err := dc.Resource(gvr).Namespace(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading SessionClaim %s/%s: %w", ns, claim, err)
	}
	ep, _, _ := unstructured.NestedString(obj.Object, "status", "endpoint")
	if ep == "" {
		return "", fmt.Errorf("SessionClaim %s/%s publishes no endpoint in its status yet (is it Bound?); give the exec API's address with --server", ns, claim)
	}
	return ep, nil
}

// execCommand runs a command in a SessionClaim's sandbox through the exec
// API and exits with the command's exit code.
func execCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f clusterFlags
	var attachStdin bool
	fs := newFlagSet("exec", "exec [-n NS] [-i] [--via api-server|node] [--server URL] [--api-ca-file F] CLAIM -- COMMAND [ARG...]", stderr)
	f.register(fs)
	fs.BoolVar(&attachStdin, "i", false, "pass stdin to the command")
	fs.BoolVar(&attachStdin, "stdin", false, "pass stdin to the command")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() < 2 {
		fmt.Fprintln(stderr, "sandboxctl exec: a claim and a command after -- are required")
		fs.Usage()
		return exitUsage
	}
	claim, argv := fs.Arg(0), fs.Args()[1:]
	// kubectl users put flags after the claim too (exec CLAIM -i -- cmd).
	if argv[0] != "--" {
		if err := fs.Parse(argv); err != nil {
			return exitUsage
		}
		argv = fs.Args()
	} else {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "sandboxctl exec: a command after -- is required")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, ns, base, err := f.apiConfig(ctx, claim)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	q := url.Values{"command": argv, "stdout": {"true"}, "stderr": {"true"}}
	opts := remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr}
	if attachStdin {
		q.Set("stdin", "true")
		opts.Stdin = stdin
	}
	u := fmt.Sprintf("%s/namespaces/%s/sessionclaims/%s/exec?%s", base, url.PathEscape(ns), url.PathEscape(claim), q.Encode())
	e, err := remotecommand.NewWebSocketExecutor(cfg, "GET", u)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	err = e.StreamWithContext(ctx, opts)
	var code exec.CodeExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return code.Code
	case strings.HasPrefix(err.Error(), refusedPrefix):
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitRefused
	default:
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
}
