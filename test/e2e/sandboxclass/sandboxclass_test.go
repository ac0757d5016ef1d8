// Package sandboxclass_test holds SandboxClass enforcement end to end: the
// admission policy of config/admission installed in a real kube-apiserver,
// and the controller with a real bwrap driver checking again on the node.
// Classes are cluster-scoped, so this suite has its own API server: its
// classes must not apply to the Sandboxes of other suites.
package sandboxclass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/config/admission"
	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
	"github.com/cireilclaw/sandbox-controller/testkit/testharness"
)

var (
	env  *testharness.Env
	k8s  client.Client
	mgr  *testharness.Manager
	ctx  = context.Background()
	srv  string // <scratch>/srv/projects: team-a and team-b below it
	rec  *testharness.Recorder
	home string
)

func TestSandboxClass(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "SandboxClass suite")
}

var _ = BeforeSuite(func() {
	testenv.Binary(GinkgoT(), "bwrap", "install bubblewrap (hack/install-deps.sh)")
	env = testharness.Start()
	k8s = env.Client
	installAdmission()

	srv = filepath.Join(env.Dir, "srv", "projects")
	home = filepath.Join(env.Dir, "home")
	for _, d := range []string{"team-a/app", "team-b", "../../home"} {
		Expect(os.MkdirAll(filepath.Join(srv, d), 0o755)).To(Succeed())
	}
	Expect(os.Symlink("/etc", filepath.Join(srv, "team-a", "etc-link"))).To(Succeed())

	drv, err := bwrap.New(bwrap.Config{StateDir: filepath.Join(env.Dir, "state")})
	Expect(err).NotTo(HaveOccurred())
	mgr = env.StartManager(map[v1alpha1.Backend]runtimes.Runtime{v1alpha1.BackendBwrap: drv}, controllers.Options{
		Host: instance.Host{AreasRoot: env.AreasRoot, Home: home},
	})
	rec = mgr.Runtimes[v1alpha1.BackendBwrap]
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.Stop()
	}
	if env != nil {
		Expect(bwrap.DetachTrees(filepath.Join(env.Dir, "state"))).To(Succeed())
	}
	env.Stop()
})

var _ = Describe("The finalizer policy", func() {
	It("gives a new Sandbox the controller's finalizer as it is stored, and the controller runs it without writing its metadata", func() {
		ns := env.NewNamespace()
		// A class of its own: once other specs made classes, a Sandbox
		// naming none is refused.
		cls := teamA("finalizer-test")
		Expect(k8s.Create(ctx, cls)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(cls) })
		sb := sandbox(ns, "finalized-at-create", cls.Name, nil, v1alpha1.Devices{})
		tenant := client.WithFieldOwner(k8s, "tenant")
		Expect(tenant.Create(ctx, sb)).To(Succeed())
		Expect(sb.Finalizers).To(ContainElement(v1alpha1.Finalizer), "the create's answer should carry the finalizer")
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "finalized-at-create-claim", sb.Name))).To(Succeed())
		Eventually(env.SandboxStatus(ns, sb.Name), testharness.Timeout).Should(testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		// Whoever writes the object itself (not its status) owns fields
		// of it: only the tenant's create did.
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sb), sb)).To(Succeed())
		for _, e := range sb.ManagedFields {
			if e.Subresource == "" {
				Expect(e.Manager).To(Equal("tenant"), "only the create should have written the Sandbox's metadata")
			}
		}
		env.DeleteAndWait(sb)
	})
})

// installAdmission applies config/admission as an administrator would.
func installAdmission() {
	dir := filepath.Join("..", "..", "..", "config", "admission")
	for _, f := range []string{"sandboxclass_policy.yaml", "sandboxclass_binding.yaml", "node_policy.yaml", "nodeclaim_policy.yaml", "finalizer_policy.yaml", "finalizer_binding.yaml"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		Expect(err).NotTo(HaveOccurred())
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				Expect(err).To(MatchError(io.EOF), f)
				break
			}
			Expect(k8s.Create(ctx, u)).To(Succeed(), f)
		}
	}
	// The finalizer policy is in force once a new Sandbox has the
	// finalizer (both are there: this only waits).
	Expect(admission.InstallFinalizer(ctx, k8s, "default", testharness.Timeout)).To(Succeed())
}

// teamA allows bwrap with mounts below srv/projects/team-a only, TZ and
// the locale passed through, no devices.
func teamA(name string) *v1alpha1.SandboxClass {
	return &v1alpha1.SandboxClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SandboxClassSpec{
			AllowedBackends:         []v1alpha1.Backend{v1alpha1.BackendBwrap},
			AllowedMountSourceRoots: []string{filepath.Join(srv, "team-a")},
			AllowedEnv:              []string{"TZ", "LC_*"},
			MaxMounts:               ptr.To[int32](2),
			AllowedEgress:           []string{"github.com", "*.pythonhosted.org"},
			MaxResources: &v1alpha1.Resources{PidsLimit: ptr.To[int64](512),
				Limits: v1alpha1.ResourceAmounts{CPU: ptr.To(resource.MustParse("2")), Memory: ptr.To(resource.MustParse("1Gi"))}},
		},
	}
}

func sandbox(ns, name, class string, mounts []v1alpha1.Mount, devices v1alpha1.Devices) *v1alpha1.Sandbox {
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.SandboxSpec{Agent: ns + "-" + name, ClassName: class, Mounts: mounts, Devices: devices,
			Binaries: []v1alpha1.BinaryName{"ls"}},
	}
}

func mount(src string) []v1alpha1.Mount {
	return []v1alpha1.Mount{{Source: src, Target: "p", Mode: v1alpha1.MountReadWrite}}
}

// expected is the controller's message for sb under class: the words the
// admission policy must use too.
func expected(class *v1alpha1.SandboxClass, sb *v1alpha1.Sandbox) string {
	spec := sb.Spec.DeepCopy()
	spec.Backend = spec.BackendOrDefault()
	_, v := sandboxclass.Effective(class, spec, sandboxclass.Node{Home: home})
	ExpectWithOffset(1, v).NotTo(BeEmpty())
	return v[0]
}

// forbidden are the specs a team-a class refuses, by what they ask for.
func forbidden() []struct {
	name    string
	mounts  []v1alpha1.Mount
	devices v1alpha1.Devices
	// admitted: the API server cannot see why it is forbidden.
	admitted bool
} {
	return []struct {
		name     string
		mounts   []v1alpha1.Mount
		devices  v1alpha1.Devices
		admitted bool
	}{
		{name: "root", mounts: mount("/")},
		{name: "etc", mounts: mount("/etc")},
		{name: "team-b", mounts: mount(filepath.Join(srv, "team-b"))},
		{name: "sibling-prefix", mounts: mount(filepath.Join(srv, "team-a-evil"))},
		{name: "devices-all", devices: v1alpha1.Devices{All: true}},
		{name: "link-to-etc", mounts: mount(filepath.Join(srv, "team-a", "etc-link")), admitted: true},
	}
}

// nothingStarted checks that the driver was never asked to start the
// Sandbox's instance and that no area of its agent exists.
func nothingStarted(sb *v1alpha1.Sandbox) {
	name := v1alpha1.InstanceName(sb.Spec.Agent)
	ExpectWithOffset(1, rec.Count("ensure", name)).To(BeZero(), "Ensure of %s", name)
	_, err := os.Lstat(filepath.Join(env.AreasRoot, sb.Spec.Agent))
	ExpectWithOffset(1, os.IsNotExist(err)).To(BeTrue(), "the areas of %s must not exist: %v", sb.Spec.Agent, err)
}

var _ = Describe("SandboxClass", Ordered, func() {
	var ns string
	BeforeAll(func() {
		ns = env.NewNamespace()
		Expect(k8s.Create(ctx, teamA("team-a"))).To(Succeed())
		Eventually(func() error {
			// The policy takes a moment to see a new class; a Sandbox
			// mounting / is the probe.
			// A dry run: an admitted probe is not stored, so the next try
			// meets the policy again, not the name taken.
			probe := sandbox(ns, "probe", "team-a", mount("/"), v1alpha1.Devices{})
			if err := k8s.Create(ctx, probe, client.DryRunAll); err == nil {
				return fmt.Errorf("admitted")
			}
			return nil
		}, testharness.Timeout).Should(Succeed(), "the admission policy should enforce team-a")
	})

	It("refuses at admission what team-a forbids, with the controller's words", func() {
		for _, tc := range forbidden() {
			if tc.admitted {
				continue
			}
			sb := sandbox(ns, "adm-"+tc.name, "team-a", tc.mounts, tc.devices)
			err := k8s.Create(ctx, sb)
			Expect(err).To(HaveOccurred(), tc.name)
			Expect(err.Error()).To(ContainSubstring(expected(teamA("team-a"), sb)), tc.name)
		}
	})

	It("refuses at admission an env.passthrough team-a does not allow, with the controller's words", func() {
		sb := sandbox(ns, "adm-env", "team-a", nil, v1alpha1.Devices{})
		sb.Spec.Env.Passthrough = []v1alpha1.EnvVarName{"TZ", "AWS_SECRET_ACCESS_KEY"}
		err := k8s.Create(ctx, sb)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(expected(teamA("team-a"), sb)))
		Expect(err.Error()).To(ContainSubstring(`spec.env.passthrough[1]: SandboxClass "team-a" does not allow passing the controller's variable "AWS_SECRET_ACCESS_KEY"`))
		allowed := sandbox(ns, "adm-env-ok", "team-a", nil, v1alpha1.Devices{})
		allowed.Spec.Env.Passthrough = []v1alpha1.EnvVarName{"TZ", "LC_ALL"}
		Expect(k8s.Create(ctx, allowed)).To(Succeed())
	})

	It("refuses at admission egress to a host team-a does not allow, with the controller's words", func() {
		for _, hosts := range [][]string{{"pypi.org"}, {"github.com", "pythonhosted.org"}, {"*.github.com"}, {"140.82.112.3"}} {
			sb := sandbox(ns, "adm-egress", "team-a", nil, v1alpha1.Devices{})
			sb.Spec.Network = &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist}
			for _, h := range hosts {
				sb.Spec.Network.Allow = append(sb.Spec.Network.Allow, v1alpha1.EgressRule{Host: h})
			}
			err := k8s.Create(ctx, sb)
			Expect(err).To(HaveOccurred(), "%v", hosts)
			Expect(err.Error()).To(ContainSubstring(expected(teamA("team-a"), sb)))
			Expect(err.Error()).To(ContainSubstring("spec.network.allow[%d].host", len(hosts)-1))
		}
		allowed := sandbox(ns, "adm-egress-ok", "team-a", nil, v1alpha1.Devices{})
		allowed.Spec.Network = &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist, Allow: []v1alpha1.EgressRule{
			{Host: "github.com", Ports: []int32{443, 22}}, {Host: "files.pythonhosted.org"}, {Host: "*.cdn.pythonhosted.org"}}}
		Expect(k8s.Create(ctx, allowed)).To(Succeed())
	})

	It("refuses at admission resources above team-a's maximum on bwrap, with the controller's words", func() {
		for _, r := range []v1alpha1.Resources{
			{PidsLimit: ptr.To[int64](4096)},
			{Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("2Gi"))}},
			{Limits: v1alpha1.ResourceAmounts{CPU: ptr.To(resource.MustParse("4"))}},
		} {
			sb := sandbox(ns, "adm-res", "team-a", nil, v1alpha1.Devices{})
			sb.Spec.Resources = &r
			err := k8s.Create(ctx, sb)
			Expect(err).To(HaveOccurred(), "%+v", r)
			Expect(err.Error()).To(ContainSubstring(expected(teamA("team-a"), sb)))
		}
		within := sandbox(ns, "adm-res-ok", "team-a", nil, v1alpha1.Devices{})
		within.Spec.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](256), Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("512Mi"))}}
		Expect(k8s.Create(ctx, within)).To(Succeed())
	})

	It("refuses at admission the scheduling fields team-a does not allow, with the controller's words", func() {
		for name, set := range map[string]func(*v1alpha1.SandboxSpec){
			"priority": func(s *v1alpha1.SandboxSpec) { s.PriorityClassName = "system-node-critical" },
			"toleration": func(s *v1alpha1.SandboxSpec) {
				s.Tolerations = []v1alpha1.Toleration{{Key: "dedicated", Operator: "Exists"}}
			},
			"every-taint": func(s *v1alpha1.SandboxSpec) { s.Tolerations = []v1alpha1.Toleration{{Operator: "Exists"}} },
			"anti-affinity": func(s *v1alpha1.SandboxSpec) {
				s.Affinity = &v1alpha1.Affinity{PodAntiAffinity: &v1alpha1.PodAffinity{}}
			},
			"pinned": func(s *v1alpha1.SandboxSpec) { s.NodeName = "node-a" },
			"second-refused": func(s *v1alpha1.SandboxSpec) {
				s.Tolerations = []v1alpha1.Toleration{{Key: "gpu", Operator: "Exists"}, {Key: "dedicated"}}
			},
		} {
			sb := sandbox(ns, "adm-sched-"+name, "team-a", nil, v1alpha1.Devices{})
			set(&sb.Spec)
			err := k8s.Create(ctx, sb)
			Expect(err).To(HaveOccurred(), name)
			Expect(err.Error()).To(ContainSubstring(expected(teamA("team-a"), sb)), name)
		}

		By("a class that allows them admits them")
		sched := teamA("team-a-scheduling")
		sched.Spec.Scheduling = v1alpha1.ClassScheduling{AllowedPriorityClassNames: []string{"batch"}, AllowedTolerations: []string{"dedicated", "gpu"}, PodAffinity: true, NodeName: true}
		Expect(k8s.Create(ctx, sched)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(sched) })
		ok := sandbox(ns, "adm-sched-ok", sched.Name, nil, v1alpha1.Devices{})
		ok.Spec.PriorityClassName, ok.Spec.NodeName = "batch", "node-a"
		ok.Spec.Tolerations = []v1alpha1.Toleration{{Key: "gpu", Operator: "Exists"}, {Key: "dedicated", Value: "team-a"}}
		ok.Spec.Affinity = &v1alpha1.Affinity{PodAntiAffinity: &v1alpha1.PodAffinity{}}
		Eventually(func() error { return k8s.Create(ctx, ok.DeepCopy(), client.DryRunAll) }, testharness.Timeout).Should(Succeed())
		everyTaint := ok.DeepCopy()
		everyTaint.Spec.Tolerations = append(everyTaint.Spec.Tolerations, v1alpha1.Toleration{Operator: "Exists"})
		err := k8s.Create(ctx, everyTaint, client.DryRunAll)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(expected(sched, everyTaint)))
	})

	It("refuses at admission an Incus profile its class does not allow, with the controller's words", func() {
		incus := teamA("team-a-incus")
		incus.Spec.AllowedBackends = []v1alpha1.Backend{v1alpha1.BackendIncus}
		incus.Spec.AllowedImages.Incus = []string{"*"}
		incus.Spec.AllowedIncusProfiles = []string{"quota"}
		Expect(k8s.Create(ctx, incus)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(incus) })
		sb := sandbox(ns, "adm-profile", incus.Name, nil, v1alpha1.Devices{})
		sb.Spec.Backend = v1alpha1.BackendIncus
		sb.Spec.Incus = &v1alpha1.IncusSpec{Image: "debian", Profiles: []string{"quota", "privileged-ci"}}
		Eventually(func() string {
			if err := k8s.Create(ctx, sb.DeepCopy(), client.DryRunAll); err != nil {
				return err.Error()
			}
			return "admitted"
		}, testharness.Timeout).Should(ContainSubstring(expected(incus, sb)))
		ok := sb.DeepCopy()
		ok.Spec.Incus.Profiles = []string{"quota"}
		Expect(k8s.Create(ctx, ok, client.DryRunAll)).To(Succeed())
	})

	It("refuses at admission a containerd image whose registry reads as an allowed image and a tag, with the controller's words", func() {
		images := teamA("team-a-images")
		images.Spec.AllowedBackends = []v1alpha1.Backend{v1alpha1.BackendContainerd}
		images.Spec.AllowedImages.Containerd = []string{"ubuntu:*", "registry.example.com/team-a/*"}
		Expect(k8s.Create(ctx, images)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(images) })
		withImage := func(name, image string) *v1alpha1.Sandbox {
			sb := sandbox(ns, name, images.Name, nil, v1alpha1.Devices{})
			sb.Spec.Backend = v1alpha1.BackendContainerd
			sb.Spec.Containerd = &v1alpha1.ContainerdSpec{Image: image}
			return sb
		}
		// ubuntu:5000 is a registry's host and port, not ubuntu's tag.
		other := withImage("adm-registry", "ubuntu:5000/team-b/tools:1")
		Eventually(func() string {
			if err := k8s.Create(ctx, other.DeepCopy(), client.DryRunAll); err != nil {
				return err.Error()
			}
			return "admitted"
		}, testharness.Timeout).Should(ContainSubstring(expected(images, other)))
		for _, image := range []string{"ubuntu:24.04", "ubuntu:24.04@sha256:" + strings.Repeat("a", 64), "registry.example.com/team-a/sub/tools:1"} {
			Expect(k8s.Create(ctx, withImage("adm-image", image), client.DryRunAll)).To(Succeed(), image)
		}
	})

	It("refuses at admission a default class's rule for a Sandbox naming no class", func() {
		def := teamA("default-for-test")
		def.Labels = map[string]string{v1alpha1.DefaultClassLabel: "true"}
		Expect(k8s.Create(ctx, def)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(def) })
		sb := sandbox(ns, "no-class", "", mount("/etc"), v1alpha1.Devices{})
		Eventually(func() string {
			if err := k8s.Create(ctx, sb.DeepCopy(), client.DryRunAll); err != nil {
				return err.Error()
			}
			return "admitted"
		}, testharness.Timeout).Should(ContainSubstring(expected(def, sb)))
	})

	It("reports what a class changed after admission forbids, and starts nothing", func() {
		// "late" does not exist yet, so admission has no rule of it.
		var sbs []*v1alpha1.Sandbox
		for _, tc := range forbidden() {
			sb := sandbox(ns, "late-"+tc.name, "late", tc.mounts, tc.devices)
			Expect(k8s.Create(ctx, sb)).To(Succeed(), tc.name)
			Expect(k8s.Create(ctx, testharness.NewClaim(ns, sb.Name+"-claim", sb.Name))).To(Succeed())
			sbs = append(sbs, sb)
		}
		for _, sb := range sbs {
			Eventually(env.SandboxStatus(ns, sb.Name), testharness.Timeout).Should(
				HaveField("Conditions", testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonClassForbids)))
			Expect(conditionMessage(ns, sb.Name)).To(Equal(`spec.className: SandboxClass "late" does not exist`))
		}
		Expect(k8s.Create(ctx, teamA("late"))).To(Succeed())
		for _, sb := range sbs {
			want := expected(teamA("late"), sb)
			Eventually(func() string { return conditionMessage(ns, sb.Name) }, testharness.Timeout).Should(Equal(want), sb.Name)
			Expect(env.SandboxStatus(ns, sb.Name)()).To(HaveField("Conditions",
				testharness.HaveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonClassForbids)))
		}
		for _, sb := range sbs {
			nothingStarted(sb)
		}
	})

	It("runs an allowed Sandbox from the resolved source, and stops it when its class stops allowing it", func() {
		Expect(os.Symlink("app", filepath.Join(srv, "team-a", "app-link"))).To(Succeed())
		sb := sandbox(ns, "allowed", "team-a", mount(filepath.Join(srv, "team-a", "app-link")), v1alpha1.Devices{})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "allowed-claim", sb.Name))).To(Succeed())
		Eventually(env.SandboxStatus(ns, sb.Name), testharness.Timeout).Should(testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		in := described(sb)
		Expect(in.Mounts).To(HaveLen(1))
		Expect(in.Mounts[0].Source).To(Equal(filepath.Join(srv, "team-a", "app-link")))
		Expect(in.Mounts[0].Anchor).To(Equal(filepath.Join(srv, "team-a")), "the driver resolves the source beneath the root the class checked it under")

		var cls v1alpha1.SandboxClass
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "team-a"}, &cls)).To(Succeed())
		cls.Spec.AllowedMountSourceRoots = []string{filepath.Join(srv, "team-a", "other")}
		Expect(k8s.Update(ctx, &cls)).To(Succeed())
		DeferCleanup(func() {
			Expect(k8s.Get(ctx, client.ObjectKey{Name: "team-a"}, &cls)).To(Succeed())
			cls.Spec = teamA("team-a").Spec
			Expect(k8s.Update(ctx, &cls)).To(Succeed())
		})
		Eventually(env.SandboxStatus(ns, sb.Name), testharness.Timeout).Should(testharness.SandboxIs(1, metav1.ConditionFalse, v1alpha1.ReasonClassForbids))
		Expect(conditionMessage(ns, sb.Name)).To(ContainSubstring(`app-link" lies outside the mount source roots SandboxClass "team-a" allows`))
		Eventually(func() (bool, error) {
			st, err := rec.Inspect(ctx, v1alpha1.InstanceName(sb.Spec.Agent))
			return st.Running, err
		}, testharness.Timeout).Should(BeFalse(), "the instance its class no longer allows must stop")
	})

	It("requires the verb use on a named class", func() {
		user := "team-a-dev"
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-writer"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"}, Verbs: []string{"create", "get", "delete"}}}}
		Expect(k8s.Create(ctx, role)).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox-writer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})).To(Succeed())
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		as, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())

		sb := sandbox(ns, "use", "team-a", nil, v1alpha1.Devices{})
		err = as.Create(ctx, sb)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(`spec.className: team-a-dev may not use SandboxClass "team-a" (RBAC: verb use on sandboxclasses in group sandbox.cireilclaw.dev)`))

		Expect(k8s.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "use-team-a"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sandboxclasses"}, ResourceNames: []string{"team-a"}, Verbs: []string{"use"}}}})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "use-team-a"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "use-team-a"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})).To(Succeed())
		Eventually(func() error { return as.Create(ctx, sandbox(ns, "use", "team-a", nil, v1alpha1.Devices{})) }, testharness.Timeout).Should(Succeed())
	})

	It("refuses a node's controller pointing a Sandbox's status.nodeName, status.pod, or its spec, at a node", func() {
		nodeA, nodeB, unbound := nodeControllers("node-writes",
			rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes", "sandboxes/status"}, Verbs: []string{"get", "update", "patch"}})
		var err error

		placed := sandbox(ns, "placed-elsewhere", "", nil, v1alpha1.Devices{})
		pinned := sandbox(ns, "pinned-here", "", nil, v1alpha1.Devices{})
		pinned.Spec.NodeName = "node-a"
		for _, sb := range []*v1alpha1.Sandbox{placed, pinned} {
			Expect(k8s.Create(ctx, sb)).To(Succeed())
		}
		// writeAs reads sb as c and writes what change makes of it, again
		// while another writer (this suite's controller) got there first.
		writeAs := func(c client.Client, sb *v1alpha1.Sandbox, status bool, change func()) error {
			var err error
			Eventually(func() bool {
				if err = c.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
					return false
				}
				before := sb.DeepCopy()
				change()
				if status {
					err = c.Status().Update(ctx, sb)
				} else {
					// As the controller writes its finalizer: a merge patch.
					err = c.Patch(ctx, sb, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
				}
				return !apierrors.IsConflict(err)
			}, testharness.Timeout).Should(BeTrue())
			return err
		}
		// The placer's write: placed on node-b, in its Pod.
		podA := &v1alpha1.SandboxPod{Name: "placed-elsewhere-sandbox", UID: "0b3c8a40-1c57-4e55-9f1e-3a6a3c6d2f10"}
		Expect(writeAs(k8s, placed, true, func() { placed.Status.NodeName, placed.Status.Pod = "node-b", podA })).To(Succeed())

		// Another node's controller writes nothing of it: not its
		// conditions or claim count, not its finalizer; nor does a token
		// bound to no Pod.
		const notItsNode = "a node's controller writes only the Sandboxes of the node its token names"
		for _, c := range []client.Client{nodeA, unbound} {
			err = writeAs(c, placed, true, func() { placed.Status.Claims = 3 })
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(notItsNode))
			err = writeAs(c, placed, false, func() { controllerutil.AddFinalizer(placed, "example.test/kept") })
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(notItsNode))
		}
		Expect(err.Error()).To(ContainSubstring("none, the token is bound to no Pod"))
		// Nor one of no node yet.
		unplaced := sandbox(ns, "unplaced", "", nil, v1alpha1.Devices{})
		Expect(k8s.Create(ctx, unplaced)).To(Succeed())
		err = writeAs(nodeA, unplaced, true, func() { unplaced.Status.Claims = 1 })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("this Sandbox is on no node yet"))

		// Its own node's controller pointing the Sandbox at another Pod's
		// cgroup (another Sandbox's, on its own node) is refused.
		err = writeAs(nodeB, placed, true, func() {
			placed.Status.Pod = &v1alpha1.SandboxPod{Name: "other-sandbox", UID: "7d2e41f8-5f0a-4c1e-8d55-0c7b9f3a1e22"}
		})
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("a node's controller may not change status.pod"))
		err = writeAs(nodeB, placed, true, func() {
			placed.Status.Pod = &v1alpha1.SandboxPod{Name: podA.Name, UID: podA.UID, ContainerID: "containerd://" + strings.Repeat("e", 64)}
		})
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("a node's controller may not change status.pod"))
		err = writeAs(nodeB, placed, true, func() { placed.Status.Pod = nil })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("a node's controller may not change status.pod"))

		err = writeAs(nodeB, placed, true, func() { placed.Status.NodeName = "node-a" })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("a node's controller may not change status.nodeName"))
		// Clearing it would have the placer write it back, and the two
		// take turns while the Sandbox's own node stops looking at it.
		err = writeAs(nodeB, placed, true, func() { placed.Status.NodeName = "" })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("a node's controller may not change status.nodeName"))

		// Its own writes pass: the status of a Sandbox pinned to it,
		// conditions, its finalizer.
		Expect(writeAs(nodeA, pinned, true, func() { pinned.Status.NodeName = "node-a" })).To(Succeed())
		Expect(writeAs(nodeB, placed, true, func() { placed.Status.Claims = 1 })).To(Succeed())
		Expect(writeAs(nodeB, placed, false, func() { controllerutil.AddFinalizer(placed, "example.test/kept") })).To(Succeed())

		// Pinning a Sandbox to itself through the spec is refused too.
		err = writeAs(nodeB, placed, false, func() { placed.Spec.NodeName = "node-a" })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("a node's controller may not change a Sandbox's spec"))
		Expect(writeAs(k8s, placed, false, func() { controllerutil.RemoveFinalizer(placed, "example.test/kept") })).To(Succeed())
	})

	It("refuses a node's controller writing or deleting a claim of a Sandbox on another node, or on none", func() {
		nodeA, nodeB, unbound := nodeControllers("node-claim-writes",
			rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sessionclaims", "sessionclaims/status"}, Verbs: []string{"get", "update", "patch", "delete"}})
		placed := sandbox(ns, "claims-placed", "", nil, v1alpha1.Devices{})
		pinned := sandbox(ns, "claims-pinned", "", nil, v1alpha1.Devices{})
		pinned.Spec.NodeName = "node-a"
		unplaced := sandbox(ns, "claims-unplaced", "", nil, v1alpha1.Devices{})
		for _, sb := range []*v1alpha1.Sandbox{placed, pinned, unplaced} {
			Expect(k8s.Create(ctx, sb)).To(Succeed())
		}
		// The placer's write: placed on node-b.
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(placed), placed); err != nil {
				return err
			}
			placed.Status.NodeName = "node-b"
			return k8s.Status().Update(ctx, placed)
		}, testharness.Timeout).Should(Succeed())
		claimOf := func(sb string) *v1alpha1.SessionClaim {
			c := testharness.NewClaim(ns, sb+"-claim", sb)
			Expect(k8s.Create(ctx, c)).To(Succeed())
			return c
		}
		onB, onA, onNone, ofNone := claimOf(placed.Name), claimOf(pinned.Name), claimOf(unplaced.Name), claimOf("not-made-yet")
		// writeAs reads the claim as c and writes what change makes of
		// it: its status, or (status false) its finalizer, as the node's
		// controller does.
		writeAs := func(c client.Client, claim *v1alpha1.SessionClaim, status bool, change func(*v1alpha1.SessionClaim)) error {
			var err error
			Eventually(func() bool {
				cur := &v1alpha1.SessionClaim{}
				if err = c.Get(ctx, client.ObjectKeyFromObject(claim), cur); err != nil {
					return false
				}
				change(cur)
				if status {
					err = c.Status().Update(ctx, cur)
				} else {
					err = c.Update(ctx, cur)
				}
				return !apierrors.IsConflict(err)
			}, testharness.Timeout).Should(BeTrue())
			return err
		}
		forge := func(c *v1alpha1.SessionClaim) {
			c.Status.Instance = "forged"
		}
		finalize := func(c *v1alpha1.SessionClaim) { controllerutil.AddFinalizer(c, "example.test/kept") }
		const notItsNode = "a node's controller writes only the claims of Sandboxes on the node its token names"
		for _, c := range []client.Client{nodeA, unbound} {
			err := writeAs(c, onB, true, forge)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(notItsNode))
			Expect(err.Error()).To(ContainSubstring("Sandbox claims-placed is node node-b's"))
			err = writeAs(c, onB, false, finalize)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(notItsNode))
			err = c.Delete(ctx, onB.DeepCopy())
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(notItsNode))
		}
		err := writeAs(unbound, onA, true, forge)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("none, the token is bound to no Pod"))
		err = writeAs(nodeA, onNone, true, forge)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("Sandbox claims-unplaced is on no node yet"))

		// Its own node's writes pass: a claim of a Sandbox pinned to it,
		// of one placed on it; and a claim whose Sandbox does not exist
		// binds to nothing, and any node may say so.
		Expect(writeAs(nodeA, onA, true, forge)).To(Succeed())
		Expect(writeAs(nodeA, onA, false, finalize)).To(Succeed())
		Expect(writeAs(nodeB, onB, true, forge)).To(Succeed())
		Expect(writeAs(nodeA, ofNone, true, forge)).To(Succeed())
		Expect(writeAs(k8s, onA, false, func(c *v1alpha1.SessionClaim) { controllerutil.RemoveFinalizer(c, "example.test/kept") })).To(Succeed())
		Expect(nodeB.Delete(ctx, onB.DeepCopy())).To(Succeed())
	})

	It("gives a new agent a host id of its class's agentIDs", func() {
		cls := teamA("ids")
		cls.Spec.AgentIDs = "2000000100:10"
		Expect(k8s.Create(ctx, cls)).To(Succeed())
		sb := sandbox(ns, "ids", "ids", nil, v1alpha1.Devices{})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(k8s.Create(ctx, testharness.NewClaim(ns, "ids-claim", sb.Name))).To(Succeed())
		Eventually(env.SandboxStatus(ns, sb.Name), testharness.Timeout).Should(testharness.SandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		fi, err := os.Stat(filepath.Join(env.AreasRoot, sb.Spec.Agent))
		Expect(err).NotTo(HaveOccurred())
		uid := fi.Sys().(*syscall.Stat_t).Uid
		Expect(uid).To(BeNumerically(">=", 2000000100))
		Expect(uid).To(BeNumerically("<", 2000000110))

		// The same agent under a class whose ids it does not have.
		other := teamA("ids-other")
		other.Spec.AgentIDs = "2000000200:10"
		Expect(k8s.Create(ctx, other)).To(Succeed())
		var cur v1alpha1.Sandbox
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sb), &cur)).To(Succeed())
		cur.Spec.ClassName = "ids-other"
		Expect(k8s.Update(ctx, &cur)).To(Succeed())
		Eventually(func() string { return conditionMessage(ns, sb.Name) }, testharness.Timeout).Should(
			ContainSubstring(fmt.Sprintf(`spec.agent: agent %q runs as host id %d, outside the ids 2000000200:10 that SandboxClass "ids-other" allows`, sb.Spec.Agent, uid)))
	})
})

// nodeControllers are clients with the credentials of the node
// controllers' ServiceAccount, given rule (config/rbac), whose tokens are
// bound to Pods on node-a and node-b, and to no Pod: what one taken node
// could send. A node controller's token is bound to its Pod, and the API
// server names the Pod's node in the user's extra.
func nodeControllers(role string, rule rbacv1.PolicyRule) (nodeA, nodeB, unbound client.Client) {
	const nodeSA = "system:serviceaccount:sandbox-controller-system:sandbox-controller"
	Expect(k8s.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: []rbacv1.PolicyRule{rule}})).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: nodeSA}}})).To(Succeed())
	asNode := func(extra map[string][]string) client.Client {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: nodeSA, Extra: extra}
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	return asNode(map[string][]string{servingcert.NodeNameExtra: {"node-a"}}),
		asNode(map[string][]string{servingcert.NodeNameExtra: {"node-b"}}),
		asNode(nil)
}

func conditionMessage(ns, name string) string {
	st, err := env.SandboxStatus(ns, name)()
	if err != nil {
		return err.Error()
	}
	for _, c := range st.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			return c.Message
		}
	}
	return ""
}

// described is the instance the bwrap driver recorded for sb: what its
// commands bind.
func described(sb *v1alpha1.Sandbox) runtimes.Instance {
	b, err := os.ReadFile(filepath.Join(env.Dir, "state", v1alpha1.InstanceName(sb.Spec.Agent)+".json"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var rec struct {
		Instance runtimes.Instance `json:"instance"`
	}
	ExpectWithOffset(1, json.Unmarshal(b, &rec)).To(Succeed())
	return rec.Instance
}
