package execapi_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

// clusterRoles reads the ClusterRoles of a manifest in config/rbac.
func clusterRoles(file string) map[string]rbacv1.ClusterRole {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(testenv.CRDDir(3)), "..", "rbac", file))
	Expect(err).NotTo(HaveOccurred())
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	roles := map[string]rbacv1.ClusterRole{}
	for {
		var r rbacv1.ClusterRole
		err := dec.Decode(&r)
		if errors.Is(err, io.EOF) {
			return roles
		}
		Expect(err).NotTo(HaveOccurred())
		if r.Kind == "ClusterRole" {
			roles[r.Name] = r
		}
	}
}

// install creates a manifest's ClusterRole as it is.
func install(r rbacv1.ClusterRole) {
	r.ResourceVersion = ""
	err := env.Client.Create(ctx, &r)
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
}

func bindClusterRole(ns, role, user string) {
	Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role + "-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())
}

// as is a client of the API server acting as user (impersonation).
func as(user string) client.Client {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// allowed asks the API server whether user may verb sessionclaims/sub.
func allowed(user, verb, sub, ns string) bool {
	sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: v1alpha1.GroupVersion.Group, Resource: "sessionclaims", Subresource: sub, Name: "any",
		},
	}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return sar.Status.Allowed
}

// grants reports whether role has a rule giving verb on resource.
func grants(role rbacv1.ClusterRole, resource, verb string) bool {
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, v1alpha1.GroupVersion.Group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

var _ = Describe("the sandbox-admin, sandbox-edit and sandbox-view roles", Ordered, func() {
	roles := map[string]rbacv1.ClusterRole{}

	BeforeAll(func() {
		roles = clusterRoles("sandbox_user_roles.yaml")
		for _, r := range roles {
			install(r)
		}
	})

	// envtest runs no aggregation controller: the labels are checked here,
	// and the tests below bind the sandbox-* roles directly.
	DescribeTable("aggregate into the built-in roles and give exec and files only from edit up",
		func(name string, aggregateTo []string, execAndFiles bool) {
			r, ok := roles[name]
			Expect(ok).To(BeTrue(), "config/rbac/sandbox_user_roles.yaml has no ClusterRole %s", name)
			for _, to := range []string{"view", "edit", "admin"} {
				want := "true"
				if !slices.Contains(aggregateTo, to) {
					want = ""
				}
				Expect(r.Labels["rbac.authorization.k8s.io/aggregate-to-"+to]).To(Equal(want), "%s aggregating into %s", name, to)
			}
			Expect(grants(r, "sessionclaims/exec", "create")).To(Equal(execAndFiles))
			Expect(grants(r, "sessionclaims/files", "get")).To(Equal(execAndFiles))
			Expect(grants(r, "sessionclaims/files", "update")).To(Equal(execAndFiles))
			Expect(grants(r, "sandboxes", "create")).To(Equal(execAndFiles))
		},
		Entry("sandbox-view", "sandbox-view", []string{"view", "edit", "admin"}, false),
		Entry("sandbox-edit", "sandbox-edit", []string{"edit", "admin"}, true),
		Entry("sandbox-admin", "sandbox-admin", []string{"admin"}, true),
	)

	It("let a namespace editor create Sandboxes and claims and exec in their namespace, and nowhere else", func() {
		own, other := env.NewNamespace(), env.NewNamespace()
		bindClusterRole(own, "sandbox-edit", "editor")
		editor := as("editor")

		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: own, Name: "box"},
			Spec:       v1alpha1.SandboxSpec{Agent: "edited-" + own, Binaries: []v1alpha1.BinaryName{"sh"}},
		}
		Expect(editor.Create(ctx, sb)).To(Succeed())
		Expect(editor.Create(ctx, testharness.NewClaim(own, "mine", "box"))).To(Succeed())

		elsewhere := sb.DeepCopy()
		elsewhere.Namespace, elsewhere.ResourceVersion = other, ""
		Expect(apierrors.IsForbidden(editor.Create(ctx, elsewhere))).To(BeTrue(), "an editor created a Sandbox in another namespace")
		Expect(apierrors.IsForbidden(editor.Create(ctx, testharness.NewClaim(other, "theirs", "box")))).To(BeTrue(), "an editor created a claim in another namespace")
		Expect(allowed("editor", "create", "exec", own)).To(BeTrue())
		Expect(allowed("editor", "create", "exec", other)).To(BeFalse())
		Expect(allowed("editor", "update", "files", other)).To(BeFalse())

		By("execing in their own claim through the exec API, and being refused in another namespace")
		Eventually(env.ClaimStatus(own, "mine"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		u, err := testEnv.AddUser(envtest.User{Name: "editor"}, nil)
		Expect(err).NotTo(HaveOccurred())
		cert := apiConfig(u.Config())
		res := execIn(ctx, cert, own, "mine", nil, nil, "sh", "-c", "echo mine")
		Expect(res.err).NotTo(HaveOccurred())
		Expect(res.stdout).To(Equal("mine\n"))
		res = execIn(ctx, cert, other, "theirs", nil, nil, "sh", "-c", "echo theirs")
		Expect(res.err).To(MatchError(ContainSubstring(`user "editor" cannot create resource "sessionclaims/exec"`)))
		code, msg := fileRequest(cert, "GET", other, "theirs", "workspace", nil)
		Expect(code).To(Equal(http.StatusForbidden), msg)
	})

	It("let a viewer read Sandboxes and claims but neither create them nor exec nor read files", func() {
		ns := env.NewNamespace()
		bindClusterRole(ns, "sandbox-view", "viewer")
		viewer := as("viewer")
		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "box"},
			Spec:       v1alpha1.SandboxSpec{Agent: "viewed-" + ns, Binaries: []v1alpha1.BinaryName{"sh"}},
		}
		Expect(env.Client.Create(ctx, sb)).To(Succeed())
		Expect(env.Client.Create(ctx, testharness.NewClaim(ns, "c", "box"))).To(Succeed())

		var list v1alpha1.SandboxList
		Expect(viewer.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		mine := sb.DeepCopy()
		mine.Name, mine.ResourceVersion = "viewers-own", ""
		Expect(apierrors.IsForbidden(viewer.Create(ctx, mine))).To(BeTrue(), "a viewer created a Sandbox")
		Expect(apierrors.IsForbidden(viewer.Create(ctx, testharness.NewClaim(ns, "viewers-claim", "box")))).To(BeTrue(), "a viewer created a claim")
		Expect(allowed("viewer", "create", "exec", ns)).To(BeFalse())
		Expect(allowed("viewer", "get", "files", ns)).To(BeFalse())

		Eventually(env.ClaimStatus(ns, "c"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		u, err := testEnv.AddUser(envtest.User{Name: "viewer"}, nil)
		Expect(err).NotTo(HaveOccurred())
		cert := apiConfig(u.Config())
		res := execIn(ctx, cert, ns, "c", nil, nil, "sh", "-c", "echo no")
		Expect(res.err).To(MatchError(ContainSubstring(`user "viewer" cannot create resource "sessionclaims/exec"`)))
		code, msg := fileRequest(cert, "GET", ns, "c", "workspace", nil)
		Expect(code).To(Equal(http.StatusForbidden), msg)
	})
})

var _ = Describe("the controller's own ClusterRole", func() {
	It("is all a controller needs to run a Sandbox from claim to deletion", func() {
		const node = "rbac-node"
		role := clusterRoles("role.yaml")["sandbox-controller"]
		Expect(role.Rules).NotTo(BeEmpty())
		install(role)
		sa := "system:serviceaccount:sandbox-system:sandbox-controller"
		Expect(env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-controller"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "sandbox-controller"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "sandbox-system", Name: "sandbox-controller"}},
		})).To(Succeed())
		Expect(allowed(sa, "create", "exec", "default")).To(BeFalse(), "the controller may exec in claims")

		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: sa}
		drv, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(env.Dir, "bwrap-"+node)})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(bwrap.DetachTrees(filepath.Join(env.Dir, "bwrap-"+node))).To(Succeed()) })
		restricted := &testharness.Env{Config: cfg, Client: env.Client, Scheme: env.Scheme, AreasRoot: filepath.Join(env.Dir, "areas-"+node), Dir: env.Dir}
		m := restricted.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{NodeName: node})
		DeferCleanup(m.Stop)

		ns := env.NewNamespace()
		sb := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "box"},
			Spec:       v1alpha1.SandboxSpec{Agent: "least-" + ns, NodeName: node, Binaries: []v1alpha1.BinaryName{"sh"}},
		}
		Expect(env.Client.Create(ctx, sb)).To(Succeed())
		Expect(env.Client.Create(ctx, testharness.NewClaim(ns, "c", "box"))).To(Succeed())
		Eventually(env.ClaimStatus(ns, "c"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSandboxReady)))
		Eventually(env.SandboxStatus(ns, "box"), timeout).Should(HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRunning)))
		env.DeleteAndWait(sb)
	})
})
