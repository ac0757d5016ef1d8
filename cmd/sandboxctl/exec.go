package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/exec"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/exectoken"
)

// refusedPrefix starts the message of a command the policy refused; the
// exec API sends it on the status channel and nothing ran.
const refusedPrefix = "command refused"

// clusterFlags select the cluster, the claim's namespace and the exec API.
// kube holds kubectl's own flags (--kubeconfig, --context, -n, --as,
// --as-group, --request-timeout, --token, ...), read as kubectl reads
// them; --server and --insecure-skip-tls-verify are not kubectl's here:
// they name and trust the exec API.
type clusterFlags struct {
	kube                kubeFlags
	server, caFile      string
	audience, tokenFile string
	systemNamespace     string
	insecure            bool
	via                 string
}

// kubeFlags are kubectl's flags, bound with client-go's kubeconfig loader
// alone: sandboxctl links no typed client and no kubectl library, which
// would cost every one-shot run their start.
type kubeFlags struct {
	rules     clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
}

func newClusterFlags() *clusterFlags {
	f := &clusterFlags{}
	f.kube.rules = *clientcmd.NewDefaultClientConfigLoadingRules()
	return f
}

// addFlags registers kubectl's flags but --server and
// --insecure-skip-tls-verify, which are the exec API's.
func (k *kubeFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&k.rules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use for CLI requests.")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	names.ClusterOverrideFlags.APIServer.LongName = ""
	names.ClusterOverrideFlags.InsecureSkipTLSVerify.LongName = ""
	names.Timeout.Default = ""
	clientcmd.BindOverrideFlags(&k.overrides, fs, names)
}

// loader is the kubeconfig as the flags select it.
func (k *kubeFlags) loader() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&k.rules, &k.overrides)
}

// namespace is -n, else the kubeconfig context's.
func (k *kubeFlags) namespace(cc clientcmd.ClientConfig) (string, error) {
	if ns := k.overrides.Context.Namespace; ns != "" {
		return ns, nil
	}
	ns, _, err := cc.Namespace()
	return ns, err
}

// How a client reaches the exec API (--via).
const (
	viaAPIServer = "api-server"
	viaNode      = "node"
)

func (f *clusterFlags) register(fs *pflag.FlagSet) {
	f.kube.addFlags(fs)
	fs.StringVar(&f.via, "via", "", "how to reach the claim's sandbox: api-server (the aggregated API "+v1alpha1.SubresourceGroup+", with the kubeconfig's own credentials, from anywhere kubectl works) or node (the exec API of the Sandbox's node, the claim's status.endpoint); default api-server when the API server serves that API, else node")
	fs.StringVar(&f.server, "server", "", "the exec API's address (https://host:port); default the endpoint in the claim's status")
	fs.StringVar(&f.caFile, "api-ca-file", "", "CA bundle that signed the exec API's serving certificate (default: the cluster's exec API CA, published in ConfigMap "+v1alpha1.ExecCAConfigMap+" of --system-namespace; without one, the kubeconfig's CA)")
	fs.StringVar(&f.systemNamespace, "system-namespace", v1alpha1.DefaultSystemNamespace, "the controller's namespace, where the exec API's CA is published")
	fs.BoolVar(&f.insecure, "insecure-skip-tls-verify", false, "do not verify the exec API's serving certificate (testing only)")
	fs.StringVar(&f.audience, "api-audience", v1alpha1.ExecAudience, "the audience the exec API accepts tokens for (its --api-audience)")
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
	if t := f.kube.overrides.Timeout; t != "" {
		if _, err := strconv.Atoi(t); err != nil {
			if _, err := time.ParseDuration(t); err != nil {
				return nil, "", "", fmt.Errorf("--request-timeout %q: give seconds or a duration such as 30s or 2m", t)
			}
		}
	}
	cc := f.kube.loader()
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", "", fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns, err := f.kube.namespace(cc)
	if err != nil {
		return nil, "", "", fmt.Errorf("finding the namespace: %w", err)
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
		return cfg, ns, strings.TrimSuffix(cfg.Host, "/") + v1alpha1.SubresourcePrefix, nil
	}
	server, node := f.server, ""
	if server == "" {
		if server, node, err = claimEndpoint(ctx, cfg, ns, claim); err != nil {
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
	if node != "" && !f.insecure {
		// The node's certificate must name the Sandbox's node, whatever
		// address the claim's endpoint gives: a node's controller writes
		// that endpoint, and a taken one could point it at itself.
		api.ServerName = node
	}
	return api, ns, strings.TrimSuffix(server, "/") + "/api/v1alpha1", nil
}

// aggregatedServed reports whether the API server serves the aggregated
// exec API: its discovery answers only while the APIService is Available.
// Asked with a deadline; an answer other than "not served" (the API
// server unreachable, discovery refused) is said on stderr before the
// node path is taken, so a switch of path is never silent.
func aggregatedServed(cfg *rest.Config) bool {
	gv := v1alpha1.SubresourceGroup + "/" + v1alpha1.SubresourceVersion
	res, err := groupResources(cfg, gv)
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

// groupResources is the API server's discovery document of one group
// version (GET /apis/<gv>), read with a deadline. client-go's discovery
// client would link the typed clients of every API group.
func groupResources(cfg *rest.Config, gv string) (*metav1.APIResourceList, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 10 * time.Second
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, err
	}
	base.Path = path.Join(base.Path, "/apis", gv)
	resp, err := hc.Get(base.String())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, apierrors.NewGenericServerResponse(resp.StatusCode, http.MethodGet, schema.GroupResource{Group: v1alpha1.SubresourceGroup}, "", strings.TrimSpace(string(body)), 0, false)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("reading the discovery document of %s: %w", gv, err)
	}
	return &list, nil
}

// publishedCA is the exec API's CA the controllers publish, or nil when
// the cluster has none (its exec APIs were given certificates of their
// own, and the kubeconfig's CA or --api-ca-file is to be used).
func publishedCA(ctx context.Context, cfg *rest.Config, namespace string) ([]byte, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	configMaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	cm, err := dc.Resource(configMaps).Namespace(namespace).Get(ctx, v1alpha1.ExecCAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the exec API's CA (ConfigMap %s/%s; or give --api-ca-file): %w", namespace, v1alpha1.ExecCAConfigMap, err)
	}
	ca, _, _ := unstructured.NestedString(cm.Object, "data", v1alpha1.ExecCAConfigMapKey)
	if ca == "" {
		return nil, fmt.Errorf("the ConfigMap %s/%s has no %s; give --api-ca-file", namespace, v1alpha1.ExecCAConfigMap, v1alpha1.ExecCAConfigMapKey)
	}
	return []byte(ca), nil
}

// claimEndpoint reads status.endpoint of the SessionClaim, and the node
// its Sandbox runs on (spec.nodeName, else status.nodeName; empty on one
// machine, or when the Sandbox cannot be read), whose name the endpoint's
// certificate must carry.
func claimEndpoint(ctx context.Context, cfg *rest.Config, ns, claim string) (endpoint, node string, err error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return "", "", err
	}
	obj, err := dc.Resource(v1alpha1.GroupVersion.WithResource("sessionclaims")).Namespace(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", "", fmt.Errorf("reading SessionClaim %s/%s: %w", ns, claim, err)
	}
	ep, _, _ := unstructured.NestedString(obj.Object, "status", "endpoint")
	if ep == "" {
		return "", "", fmt.Errorf("SessionClaim %s/%s publishes no endpoint in its status yet (is it Bound?); give the exec API's address with --server", ns, claim)
	}
	if name, _, _ := unstructured.NestedString(obj.Object, "spec", "sandboxName"); name != "" {
		if sb, err := dc.Resource(v1alpha1.GroupVersion.WithResource("sandboxes")).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			// Pinned, or placed (Sandbox.Node).
			if node, _, _ = unstructured.NestedString(sb.Object, "spec", "nodeName"); node == "" {
				node, _, _ = unstructured.NestedString(sb.Object, "status", "nodeName")
			}
		}
	}
	return ep, node, nil
}

func newExecCommand(c *cli) *cobra.Command {
	cf := newClusterFlags()
	var attachStdin bool
	cmd := c.verb(&cobra.Command{
		Use:   "exec CLAIM [-n NS] [-i] -- COMMAND [ARG...]",
		Short: "Run a command in a SessionClaim's sandbox",
		Long: `exec runs a command in a SessionClaim's sandbox through the controller's
exec API and exits with the command's exit code (126 when the policy refused
it and nothing ran). By default it goes through the API server when it
serves the aggregated API, with the kubeconfig as it is (--via api-server);
else, or with --via node, to the Sandbox's node, where it sends the
kubeconfig's client certificate, or a token for the exec API's audience: a
service account token is exchanged for one (TokenRequest), others are never
forwarded (--api-token-file gives one).`,
		Example: `  kubectl sandbox exec alice-session-1 -n team-a -- git status
  echo hello | kubectl sandbox exec -i alice-session-1 -- cat
  kubectl sandbox exec alice-session-1 --as alice --via api-server -- ls /workspace`,
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return claimNames(cf, toComplete, "")
		},
	}, func(cmd *cobra.Command, args []string) int {
		before, argv, dash := dashArgs(cmd, args)
		if !dash && len(args) > 1 {
			// exec CLAIM COMMAND, as kubectl exec accepted it once.
			before, argv = args[:1], args[1:]
		}
		switch {
		case len(before) == 0:
			return usageError(cmd, "a claim and a command after -- are required")
		case len(before) > 1:
			return usageError(cmd, "one claim, then -- and the command: got %q before --", before)
		case len(argv) == 0:
			return usageError(cmd, "a command after -- is required")
		}
		return execCommand(cf, before[0], argv, attachStdin, c.stdin, c.stdout, c.stderr)
	})
	cf.register(cmd.Flags())
	cmd.Flags().BoolVarP(&attachStdin, "stdin", "i", false, "pass stdin to the command")
	registerClusterCompletion(cmd, cf)
	return cmd
}

// execCommand runs a command in a SessionClaim's sandbox through the exec
// API and exits with the command's exit code.
func execCommand(f *clusterFlags, claim string, argv []string, attachStdin bool, stdin io.Reader, stdout, stderr io.Writer) int {
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
