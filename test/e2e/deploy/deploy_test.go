// Package deploy_test proves `make deploy` and `make undeploy` against a
// real kube-apiserver that starts empty (no CRDs): the targets themselves
// run, with KUBECONFIG pointing at it. The API server validates every
// object they apply (the DaemonSet's privileged pod, host paths and mount
// propagation, with and without the backends' components); the
// controller's service account may do what the controller does, and no
// more; undeploy removes everything, and stops in bounded time, naming
// them, when finalizers are stuck.
//
// No kubelet and no controller run here: the DaemonSet's pods never start
// and no Sandbox becomes Ready. Where a deployment needs them, the test
// plays their part: the controller's writes through its service account,
// and the namespace controller (kube-controller-manager's) finalizing the
// deleted namespace.
package deploy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/localcp"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const (
	namespace = "sandbox-controller-system"
	name      = "sandbox-controller"
	// version is the VERSION the tests deploy: `make image` tags its image
	// sandbox-controller:VERSION, and that is the image deploy must name.
	version      = "deploy-test"
	defaultImage = "sandbox-controller:" + version
	otherImage   = "registry.example:5000/team/sandbox-controller:v0.1.0"
	// controllerSA is the user the controller's pods act as.
	controllerSA = "system:serviceaccount:" + namespace + ":" + name
	// apiSA is the user the aggregated API's pods act as.
	apiSA = "system:serviceaccount:" + namespace + ":" + name + "-api"
	// undeployBound is the most a make undeploy may take here, stuck or not.
	undeployBound = 2 * time.Minute
)

var (
	ctx        = context.Background()
	env        *envtest.Environment
	k8s        client.Client // an administrator, without a cache
	kube       kubernetes.Interface
	controller client.Client // the controller's service account
	repo       string
	kubectl    string
	kubeconfig string
	scratch    string
)

func TestDeploy(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Deploy suite")
}

// adminCfg is the API server's own administrator configuration.
var adminCfg *rest.Config

var _ = BeforeSuite(func() {
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(GinkgoT(), "envtest binaries", p)
	}
	kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		testenv.Missing(GinkgoT(), "kubectl", "build it beside kube-apiserver with WITH_KUBECTL=1 hack/envtest-assets.sh (make test does)")
	}
	testenv.Binary(GinkgoT(), "make", "install make (apt-get install make)")
	var err error
	repo, err = filepath.Abs(filepath.Join("..", "..", ".."))
	Expect(err).NotTo(HaveOccurred())
	scratch, err = os.MkdirTemp("", "deploy-test-")
	Expect(err).NotTo(HaveOccurred())

	// No CRDs: installing them is what make deploy is for.
	env = &envtest.Environment{}
	cfg, err := localcp.StartEnvironment(env)
	Expect(err).NotTo(HaveOccurred())
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	kube, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	adminCfg = cfg
	as := rest.CopyConfig(cfg)
	// node-a's controller: its token is bound to its Pod on node-a.
	as.Impersonate = rest.ImpersonationConfig{UserName: controllerSA, Extra: map[string][]string{servingcert.NodeNameExtra: {"node-a"}}}
	controller, err = client.New(as, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	admin, err := env.AddUser(envtest.User{Name: "cluster-admin", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kc, err := admin.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	kubeconfig = filepath.Join(scratch, "kubeconfig")
	Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
	if scratch != "" {
		Expect(os.RemoveAll(scratch)).To(Succeed())
	}
})

// runMake runs make in the repository as an administrator would, with
// KUBECONFIG in the environment and the kubectl beside the API server, and
// returns its output; the whole process group is killed after timeout.
func runMake(timeout time.Duration, args ...string) (string, error) {
	cmd, cancel := testenv.Command(timeout, "make", append([]string{"--no-print-directory", "-C", repo, "KUBECTL=" + kubectl}, args...)...)
	defer cancel()
	cmd.Env = append(environWithout("IMG", "BACKENDS", "UNDEPLOY_TIMEOUT", "VERSION"), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ make %s\n%s\n", strings.Join(args, " "), out)
	return string(out), err
}

// environWithout is this process's environment without the make variables
// a developer may have exported: each test says what it deploys.
func environWithout(keys ...string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(keys, k)
	})
}

// rendered is what config/default holds, as kubectl renders it: every
// object deploy must create and undeploy must delete.
func rendered() []*unstructured.Unstructured {
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(repo, "config", "default")).Output()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			ExpectWithOffset(1, errors.Is(err, io.EOF)).To(BeTrue(), "decoding the rendered kustomization: %v", err)
			break
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	ExpectWithOffset(1, objs).NotTo(BeEmpty())
	return objs
}

// live reads obj's current state from the API server.
func live(obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(obj.GroupVersionKind())
	return u, k8s.Get(ctx, client.ObjectKeyFromObject(obj), u)
}

func describe(obj *unstructured.Unstructured) string {
	return obj.GetKind() + " " + client.ObjectKeyFromObject(obj).String()
}

func daemonSet() *appsv1.DaemonSet {
	ds := &appsv1.DaemonSet{}
	ExpectWithOffset(1, k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds)).To(Succeed())
	return ds
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return "<unset>"
}

func mountOf(c corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func hostPaths(ds *appsv1.DaemonSet) map[string]string {
	paths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	return paths
}

// asController adds or removes the controller's finalizer through the
// controller's service account, as the controller does.
func asController(obj client.Object, add bool) error {
	if err := controller.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return err
	}
	before := obj.DeepCopyObject().(client.Object)
	if add {
		controllerutil.AddFinalizer(obj, v1alpha1.Finalizer)
	} else {
		controllerutil.RemoveFinalizer(obj, v1alpha1.Finalizer)
	}
	if _, isSandbox := obj.(*v1alpha1.Sandbox); isSandbox {
		// A patch of the finalizers alone, as the Sandbox reconciler does.
		return controller.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	}
	return controller.Update(ctx, obj)
}

// playNamespaceController finalizes the controller's namespace once it is
// being deleted, as kube-controller-manager's namespace controller does
// after emptying it (make undeploy deletes its objects itself). It runs
// until the returned function is called.
func playNamespaceController() (stop func()) {
	c, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		for c.Err() == nil {
			ns, err := kube.CoreV1().Namespaces().Get(c, namespace, metav1.GetOptions{})
			if err == nil && ns.DeletionTimestamp != nil && len(ns.Spec.Finalizers) > 0 {
				ns.Spec.Finalizers = nil
				_, _ = kube.CoreV1().Namespaces().Finalize(c, ns, metav1.UpdateOptions{})
			}
			select {
			case <-c.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}

var _ = Describe("make deploy and make undeploy", Ordered, func() {
	It("refuses an image without a tag and an unknown backend before touching the cluster", func() {
		out, err := runMake(time.Minute, "deploy", "IMG=sandbox-controller")
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("IMG=sandbox-controller has no tag"))
		out, err = runMake(time.Minute, "deploy", "VERSION="+version, "BACKENDS=firecracker")
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("no component config/backends/firecracker"))
		crds := &unstructured.UnstructuredList{}
		crds.SetAPIVersion("apiextensions.k8s.io/v1")
		crds.SetKind("CustomResourceDefinitionList")
		Expect(k8s.List(ctx, crds)).To(Succeed())
		Expect(crds.Items).To(BeEmpty())
	})

	It("installs every object of config/default, the CRDs established", func() {
		out, err := runMake(3*time.Minute, "deploy", "VERSION="+version)
		Expect(err).NotTo(HaveOccurred(), out)
		for _, obj := range rendered() {
			u, err := live(obj)
			Expect(err).NotTo(HaveOccurred(), describe(obj))
			if obj.GetKind() == "CustomResourceDefinition" {
				conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
				Expect(conds).To(ContainElement(And(HaveKeyWithValue("type", "Established"), HaveKeyWithValue("status", "True"))), describe(obj))
			}
		}
		for _, crd := range []string{"sandboxes", "sessionclaims", "sandboxclasses"} {
			Expect(out).To(ContainSubstring(crd + ".sandbox.cireilclaw.dev condition met"))
		}
	})

	It("runs the controller as a privileged DaemonSet of the versioned image with bwrap alone", func() {
		ds := daemonSet()
		pod := ds.Spec.Template.Spec
		Expect(pod.ServiceAccountName).To(Equal(name))
		Expect(pod.HostPID).To(BeFalse(), "bwrap alone needs no node pids")
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Image).To(Equal(defaultImage), "the name and tag make image gives its image")
		Expect(c.ImagePullPolicy).To(Equal(corev1.PullIfNotPresent), "an image imported on the nodes is not pulled")
		Expect(c.Args).To(ContainElements("--node-name=$(NODE_NAME)", "--areas-root=/var/lib/sandbox-controller/areas",
			"--backends=bwrap$(CONTAINERD_BACKEND)$(INCUS_BACKEND)", "--api-bind-address=:10350", "--api-advertise-address=$(NODE_IP):10350"))
		Expect(pod.HostNetwork).To(BeTrue(), "the exec API listens on the node's address, where claims point")
		Expect(envValue(c, "POD_NAMESPACE")).To(BeEmpty(), "the namespace comes from the pod (fieldRef)")
		Expect(envValue(c, "CONTAINERD_BACKEND")).To(BeEmpty())
		Expect(envValue(c, "INCUS_BACKEND")).To(BeEmpty())
		Expect(c.SecurityContext.Privileged).To(Equal(ptr.To(true)))
		Expect(hostPaths(ds)).To(Equal(map[string]string{"areas": "/var/lib/sandbox-controller", "cgroups": "/sys/fs/cgroup",
			"container-bundles": "/run/containerd/io.containerd.runtime.v2.task/k8s.io"}))
		// containerd's bundles of the kubelet's containers, where a bwrap
		// Sandbox's image is mounted after the pod starts.
		Expect(c.Args).To(ContainElement("--container-bundles=/host/run/containerd-bundles"))
		bundles := mountOf(c, "/host/run/containerd-bundles")
		Expect(bundles).NotTo(BeNil())
		Expect(bundles.MountPropagation).To(HaveValue(Equal(corev1.MountPropagationHostToContainer)))
		// The node's cgroups, where the kubelet makes the Pods' cgroups
		// the sandboxes' processes run in.
		Expect(c.Args).To(ContainElement("--pod-cgroups=/host/sys/fs/cgroup"))
		Expect(mountOf(c, "/host/sys/fs/cgroup")).NotTo(BeNil())
		areas := mountOf(c, "/var/lib/sandbox-controller")
		Expect(areas).NotTo(BeNil(), "the areas are at the same path in the pod as on the node")
		Expect(areas.MountPropagation).To(BeNil())

		var ns corev1.Namespace
		Expect(k8s.Get(ctx, client.ObjectKey{Name: namespace}, &ns)).To(Succeed())
		Expect(ns.Labels).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "privileged"))
		var crb rbacv1.ClusterRoleBinding
		Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, &crb)).To(Succeed())
		Expect(crb.RoleRef.Name).To(Equal(name))
		Expect(crb.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: name, Namespace: namespace}))
	})

	It("adds the containerd and incus components and another image, and takes them away again", func() {
		out, err := runMake(3*time.Minute, "deploy", "VERSION="+version, "BACKENDS=containerd,incus", "IMG="+otherImage, "CONTAINER_BUNDLES=/srv/containerd/state/io.containerd.runtime.v2.task/k8s.io")
		Expect(err).NotTo(HaveOccurred(), out)
		ds := daemonSet()
		c := ds.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal(otherImage))
		Expect(ds.Spec.Template.Spec.HostPID).To(BeTrue(), "runtimes/mountns enters containers by their node pid")
		Expect(envValue(c, "CONTAINERD_BACKEND")).To(Equal(",containerd"))
		Expect(envValue(c, "INCUS_BACKEND")).To(Equal(",incus"))
		Expect(hostPaths(ds)).To(Equal(map[string]string{
			"areas": "/var/lib/sandbox-controller", "cgroups": "/sys/fs/cgroup", "containerd": "/run/containerd", "incus": "/var/lib/incus",
			"container-bundles": "/srv/containerd/state/io.containerd.runtime.v2.task/k8s.io"}))
		Expect(mountOf(c, "/var/lib/sandbox-controller").MountPropagation).To(Equal(ptr.To(corev1.MountPropagationBidirectional)))
		Expect(mountOf(c, "/run/containerd").MountPropagation).To(Equal(ptr.To(corev1.MountPropagationHostToContainer)))
		Expect(mountOf(c, "/var/lib/incus").MountPropagation).To(Equal(ptr.To(corev1.MountPropagationHostToContainer)))

		out, err = runMake(3*time.Minute, "deploy", "VERSION="+version)
		Expect(err).NotTo(HaveOccurred(), out)
		ds = daemonSet()
		c = ds.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal(defaultImage))
		Expect(ds.Spec.Template.Spec.HostPID).To(BeFalse())
		Expect(envValue(c, "CONTAINERD_BACKEND")).To(BeEmpty())
		Expect(hostPaths(ds)).To(Equal(map[string]string{"areas": "/var/lib/sandbox-controller", "cgroups": "/sys/fs/cgroup",
			"container-bundles": "/run/containerd/io.containerd.runtime.v2.task/k8s.io"}))
		Expect(mountOf(c, "/var/lib/sandbox-controller").MountPropagation).To(BeNil())
	})

	It("takes the samples, and lets the controller's service account do what the controller does", func() {
		out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "-n", "default", "-f", filepath.Join(repo, "config", "samples")).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		// A Sandbox naming a class the controller may not use: the
		// controller must still add and remove its finalizer.
		bob := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bob"},
			Spec:       v1alpha1.SandboxSpec{Agent: "bob", ClassName: "team-a", Binaries: []v1alpha1.BinaryName{"git"}},
		}
		Expect(k8s.Create(ctx, bob)).To(Succeed())

		var sandboxes v1alpha1.SandboxList
		Expect(controller.List(ctx, &sandboxes)).To(Succeed())
		Expect(sandboxes.Items).To(HaveLen(2))
		Expect(controller.List(ctx, &v1alpha1.SessionClaimList{})).To(Succeed())
		Expect(controller.List(ctx, &v1alpha1.SandboxClassList{})).To(Succeed())

		alice := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alice"}}
		claim := &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alice-session-1"}}
		// Placed on node-a, as the aggregated API's placer does: a node's
		// controller writes only the Sandboxes of its own node.
		for _, sb := range []*v1alpha1.Sandbox{alice, bob} {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sb), sb)).To(Succeed())
			read := sb.DeepCopy()
			sb.Status.NodeName = "node-a"
			Expect(k8s.Status().Patch(ctx, sb, client.MergeFrom(read))).To(Succeed())
		}
		for _, obj := range []client.Object{alice, bob, claim} {
			Expect(asController(obj, true)).To(Succeed(), "adding the finalizer of %s", obj.GetName())
		}
		before := alice.DeepCopy()
		meta.SetStatusCondition(&alice.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady,
			Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonStopped, Message: "written by the deploy test"})
		Expect(controller.Status().Patch(ctx, alice, client.MergeFrom(before))).To(Succeed())
		// Placement is the aggregated API's: make deploy's admission policy
		// refuses a node's controller pointing status.nodeName at a node.
		read := alice.DeepCopy()
		alice.Status.NodeName = "node-b"
		err = controller.Status().Patch(ctx, alice, client.MergeFromWithOptions(read, client.MergeFromWithOptimisticLock{}))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a node's controller placed a Sandbox: %v", err)
		alice.Status.NodeName = "node-a"

		err = controller.Create(ctx, &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mallory"},
			Spec:       v1alpha1.SandboxSpec{Agent: "mallory"},
		})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the controller never creates Sandboxes: %v", err)

		By("making both CAs as the aggregated API does, and reading the exec API's as a node's controller does")
		apiAs := rest.CopyConfig(adminCfg)
		apiAs.Impersonate = rest.ImpersonationConfig{UserName: apiSA}
		aggregated, err := client.New(apiAs, client.Options{})
		Expect(err).NotTo(HaveOccurred())
		execCA, err := servingcert.ExecAPICA.Ensure(ctx, aggregated, namespace, time.Now())
		Expect(err).NotTo(HaveOccurred())
		Expect(servingcert.ExecAPICA.Publish(ctx, aggregated, namespace, execCA.PEM)).To(Succeed())
		fwdSrc := &servingcert.Source{Client: aggregated, Namespace: namespace, Authority: servingcert.ForwarderCA, ClientName: servingcert.ForwarderName,
			Hosts: []string{"sandbox-controller-exec-api." + namespace + ".svc"}, Log: GinkgoLogr}
		Expect(fwdSrc.Load(ctx)).To(Succeed())
		Expect(apierrors.IsForbidden(controller.Get(ctx, client.ObjectKey{Namespace: namespace, Name: servingcert.SecretName}, &corev1.Secret{}))).To(BeTrue(),
			"no node's controller reads the exec API CA's key")

		By("signing a node's serving certificate as the aggregated API does, for the node its controller's token names")
		nodeA := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
		Expect(k8s.Create(ctx, nodeA)).To(Succeed())
		nodeA.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}}
		Expect(k8s.Status().Update(ctx, nodeA)).To(Succeed())
		signerScheme := runtime.NewScheme()
		Expect(clientgoscheme.AddToScheme(signerScheme)).To(Succeed())
		mgr, err := ctrl.NewManager(apiAs, ctrl.Options{Scheme: signerScheme, Metrics: metricsserver.Options{BindAddress: "0"}})
		Expect(err).NotTo(HaveOccurred())
		Expect((&servingcert.Signer{Client: mgr.GetClient(), User: controllerSA, CA: execCA, Validity: time.Hour}).SetupWithManager(mgr)).To(Succeed())
		signerCtx, stopSigner := context.WithCancel(ctx)
		defer stopSigner()
		go func() {
			defer GinkgoRecover()
			Expect(mgr.Start(signerCtx)).To(Succeed())
		}()
		onNodeA := actingAs(controllerSA)
		onNodeA.Impersonate.Extra = map[string][]string{servingcert.NodeNameExtra: {"node-a"}}
		nodeClient, err := client.New(onNodeA, client.Options{})
		Expect(err).NotTo(HaveOccurred())
		src := &servingcert.Source{Client: nodeClient, Namespace: namespace, Hosts: []string{"10.0.0.7", "node-a"}, Request: true, Node: "node-a", Log: GinkgoLogr}
		loadCtx, cancelLoad := context.WithTimeout(ctx, time.Minute)
		defer cancelLoad()
		Expect(src.Load(loadCtx)).To(Succeed())
		Expect(src.CAPEM()).To(Equal(execCA.PEM))
		Expect(k8s.Delete(ctx, nodeA)).To(Succeed())
		anyone := rest.CopyConfig(adminCfg)
		anyone.Impersonate = rest.ImpersonationConfig{UserName: "someone", Groups: []string{"system:authenticated"}}
		someone, err := client.New(anyone, client.Options{})
		Expect(err).NotTo(HaveOccurred())
		_, found, err := servingcert.ExecAPICA.ReadPublished(ctx, someone, namespace)
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue(), "any authenticated user reads the CA")
		Expect(apierrors.IsForbidden(someone.Get(ctx, client.ObjectKey{Namespace: namespace, Name: servingcert.SecretName}, &corev1.Secret{}))).To(BeTrue(),
			"nobody but the controllers reads the CA's key")

		By("a node's controller reads the forwarder CA's certificate and can neither read its key nor write what nodes trust")
		fwdPEM, found, err := servingcert.ForwarderCA.ReadPublished(ctx, controller, namespace)
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
		Expect(fwdPEM).To(Equal(fwdSrc.CAPEM()))
		nodeKube, err := kubernetes.NewForConfig(actingAs(controllerSA))
		Expect(err).NotTo(HaveOccurred())
		// What the informer of the forwarder CA lists and watches.
		_, err = nodeKube.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + servingcert.ForwarderConfigMapName})
		Expect(err).NotTo(HaveOccurred())
		Expect(apierrors.IsForbidden(controller.Get(ctx, client.ObjectKey{Namespace: namespace, Name: servingcert.ForwarderSecretName}, &corev1.Secret{}))).To(BeTrue(),
			"a node never reads the forwarder CA's key")
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: servingcert.ForwarderConfigMapName}, cm)).To(Succeed())
		cm.Data[servingcert.ConfigMapKey] = string(execCA.PEM)
		Expect(apierrors.IsForbidden(controller.Update(ctx, cm))).To(BeTrue(), "a node never rewrites the forwarder CA nodes trust")
		Expect(apierrors.IsForbidden(controller.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "planted"}}))).To(BeTrue(),
			"a node makes no Secret")
		Expect(apierrors.IsForbidden(controller.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "planted"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}))).To(BeTrue(),
			"a node makes no Pod: placement is the aggregated API's")
		Expect(controller.List(ctx, &corev1.NodeList{})).To(Succeed())

		By("placing as the aggregated API does: Sandboxes' Pods made and deleted, Nodes read")
		pod := controllers.SandboxPod(&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "rbac-probe", UID: "0a0a0a0a-0000-0000-0000-000000000001"}},
			controllers.PlacementOptions{SystemNamespace: namespace}, "", 0)
		Expect(aggregated.Create(ctx, pod)).To(Succeed())
		Expect(aggregated.List(ctx, &corev1.PodList{}, client.MatchingLabels{controllers.LabelSandboxPod: "true"})).To(Succeed())
		Expect(aggregated.List(ctx, &corev1.NodeList{})).To(Succeed())
		Expect(aggregated.Delete(ctx, pod)).To(Succeed())

		By("setting the aggregated API's caBundle and reading the API server's front-proxy configuration as the aggregated API does")
		found, err = servingcert.PublishAPIService(ctx, aggregated, execapi.APIServiceName, fwdSrc.CAPEM())
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue(), "make deploy installs the APIService")

		By("keeping the caBundle: one cleared later is set again without a restart, with the controller's rights")
		pubCtx, stopPub := context.WithCancel(ctx)
		DeferCleanup(stopPub)
		go func() {
			defer GinkgoRecover()
			pub := &servingcert.APIServicePublisher{Client: aggregated, Name: execapi.APIServiceName, CA: fwdSrc.CAPEM, Interval: 500 * time.Millisecond, Log: GinkgoLogr}
			Expect(pub.Start(pubCtx)).To(Succeed())
		}()
		caBundle := func() (string, error) {
			svc := &unstructured.Unstructured{}
			svc.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"})
			if err := k8s.Get(ctx, client.ObjectKey{Name: execapi.APIServiceName}, svc); err != nil {
				return "", err
			}
			b, _, err := unstructured.NestedString(svc.Object, "spec", "caBundle")
			return b, err
		}
		want := base64.StdEncoding.EncodeToString(fwdSrc.CAPEM())
		Expect(caBundle()).To(Equal(want))
		cleared := &unstructured.Unstructured{}
		cleared.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"})
		cleared.SetName(execapi.APIServiceName)
		Expect(k8s.Patch(ctx, cleared, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"caBundle":null}}`)))).To(Succeed())
		Eventually(caBundle, 30*time.Second).Should(Equal(want))
		stopPub()
		Expect(servingcert.PublishAPIService(ctx, controller, execapi.APIServiceName, execCA.PEM)).Error().To(Satisfy(apierrors.IsForbidden),
			"a node never sets what the API server trusts")
		// Both read the API server's authentication configuration: the
		// aggregated API its front proxy, a node its client CA.
		for _, user := range []string{apiSA, controllerSA} {
			saKube, err := kubernetes.NewForConfig(actingAs(user))
			Expect(err).NotTo(HaveOccurred())
			_, err = saKube.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), user)
			// What the informers of the front-proxy authenticator list and watch.
			_, err = saKube.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=extension-apiserver-authentication"})
			Expect(err).NotTo(HaveOccurred(), user)
			_, err = saKube.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "no other ConfigMap of kube-system for %s: %v", user, err)
		}
	})

	It("stops undeploy in bounded time while finalizers hold, naming them, having deleted nothing else", func() {
		start := time.Now()
		out, err := runMake(undeployBound, "undeploy", "UNDEPLOY_TIMEOUT=5s")
		Expect(err).To(HaveOccurred(), out)
		Expect(time.Since(start)).To(BeNumerically("<", undeployBound))
		for _, s := range []string{"alice", "bob", "alice-session-1", v1alpha1.Finalizer, "Nothing else was deleted", "make undeploy again"} {
			Expect(out).To(ContainSubstring(s))
		}
		for _, obj := range rendered() {
			_, err := live(obj)
			Expect(err).NotTo(HaveOccurred(), "%s must stay while Sandboxes wait for the controller", describe(obj))
		}
		var sb v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "alice"}, &sb)).To(Succeed())
		Expect(sb.DeletionTimestamp).NotTo(BeNil())
	})

	It("removes everything once the controller has released them, and again when nothing is left", func() {
		for _, obj := range []client.Object{
			&v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alice-session-1"}},
			&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alice"}},
			&v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bob"}},
		} {
			Expect(asController(obj, false)).To(Succeed(), "removing the finalizer of %s", obj.GetName())
		}
		stop := playNamespaceController()
		out, err := runMake(undeployBound, "undeploy")
		stop()
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("The agents' areas stay on the nodes"))
		for _, obj := range rendered() {
			_, err := live(obj)
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s must be gone: %v", describe(obj), err)
		}

		out, err = runMake(undeployBound, "undeploy")
		Expect(err).NotTo(HaveOccurred(), out)
	})
})

// actingAs is the suite's administrator acting as user.
func actingAs(user string) *rest.Config {
	c := rest.CopyConfig(adminCfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user}
	return c
}
