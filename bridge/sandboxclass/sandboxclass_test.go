package sandboxclass

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// tree makes <dir>/srv/projects/{team-a,team-b}, a link team-a/etc-link ->
// /etc and a link team-a/b-link -> ../team-b, and returns dir.
func tree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"srv/projects/team-a/app", "srv/projects/team-b", "home/alice/projects"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"srv/projects/team-a/etc-link":  "/etc",
		"srv/projects/team-a/b-link":    "../team-b",
		"srv/projects/team-a/self":      "app",
		"home/alice/projects/link":      "/etc",
		"srv/projects/team-a/proc-root": "/proc/1/root",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func class(dir string) *v1alpha1.SandboxClass {
	return &v1alpha1.SandboxClass{
		ObjectMeta: metav1.ObjectMeta{Name: "team-a"},
		Spec: v1alpha1.SandboxClassSpec{
			AllowedBackends:         []v1alpha1.Backend{v1alpha1.BackendBwrap, v1alpha1.BackendContainerd},
			AllowedMountSourceRoots: []string{filepath.Join(dir, "srv/projects/team-a"), filepath.Join(dir, "home/alice/projects")},
			MaxMounts:               ptr.To[int32](2),
			AllowedEnv:              []string{"TZ", "LC_*"},
			AllowedEgress:           []string{"github.com", "*.pythonhosted.org"},
			AllowedImages:           v1alpha1.ClassImages{Containerd: []string{"docker.io/library/alpine:3.20", "registry.example.com/team-a/*", "ubuntu:*"}, Bwrap: []string{"registry.example.com/team-a/*", "python:*"}},
			DefaultLimits:           &v1alpha1.ClassLimits{MemoryLimit: ptr.To(resource.MustParse("512Mi"))},
			MaxLimits:               &v1alpha1.ClassLimits{MemoryLimit: ptr.To(resource.MustParse("1Gi")), PidsLimit: ptr.To[int64](256)},
			MaxResources:            &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{CPU: ptr.To(resource.MustParse("2"))}},
		},
	}
}

func allow(hosts ...string) *v1alpha1.Network {
	n := &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist}
	for _, h := range hosts {
		n.Allow = append(n.Allow, v1alpha1.EgressRule{Host: h})
	}
	return n
}

func TestEffective(t *testing.T) {
	dir := tree(t)
	a := filepath.Join(dir, "srv/projects/team-a")
	mount := func(src string) []v1alpha1.Mount { return []v1alpha1.Mount{{Source: src, Target: "p"}} }
	ctr := func(image string, mem string, pids int64) *v1alpha1.ContainerdSpec {
		c := &v1alpha1.ContainerdSpec{Image: image}
		if mem != "" {
			c.MemoryLimit = ptr.To(resource.MustParse(mem))
		}
		if pids != 0 {
			c.PidsLimit = ptr.To(pids)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		spec v1alpha1.SandboxSpec
		// want is a part of the first violation, or "" when allowed.
		want string
	}{
		{"allowed: no mounts", v1alpha1.SandboxSpec{}, ""},
		{"allowed: the root itself", v1alpha1.SandboxSpec{Mounts: mount(a)}, ""},
		{"allowed: below the root", v1alpha1.SandboxSpec{Mounts: mount(a + "/app")}, ""},
		{"allowed: a link staying inside the root", v1alpha1.SandboxSpec{Mounts: mount(a + "/self")}, ""},
		{"allowed: a source not created yet below the root", v1alpha1.SandboxSpec{Mounts: mount(a + "/later/deeper")}, ""},
		{"allowed: ~/ expanded into a root", v1alpha1.SandboxSpec{Mounts: mount("~/projects")}, ""},
		{"refused: /", v1alpha1.SandboxSpec{Mounts: mount("/")}, `spec.mounts[0].source: "/" lies outside the mount source roots SandboxClass "team-a" allows`},
		{"refused: /etc", v1alpha1.SandboxSpec{Mounts: mount("/etc")}, `spec.mounts[0].source: "/etc" lies outside`},
		{"refused: another team's directory", v1alpha1.SandboxSpec{Mounts: mount(dir + "/srv/projects/team-b")}, "srv/projects/team-b\" lies outside"},
		{"refused: a sibling sharing the root's prefix", v1alpha1.SandboxSpec{Mounts: mount(a + "-evil")}, "lies outside"},
		{"refused: a link below the root to /etc", v1alpha1.SandboxSpec{Mounts: mount(a + "/etc-link")}, "leads, through a symbolic link, outside the mount source roots"},
		{"refused: a link below the root to another team", v1alpha1.SandboxSpec{Mounts: mount(a + "/b-link")}, "leads, through a symbolic link, outside"},
		{"refused: a missing source below a link to /etc", v1alpha1.SandboxSpec{Mounts: mount(a + "/etc-link/new")}, "leads, through a symbolic link, outside"},
		{"refused: ~/ expanded into a link to /etc", v1alpha1.SandboxSpec{Mounts: mount("~/projects/link")}, `"~/projects/link" leads, through a symbolic link, outside`},
		{"refused: ~/ outside the roots", v1alpha1.SandboxSpec{Mounts: mount("~/.ssh")}, `"~/.ssh" lies outside`},
		{"refused: a /proc magic link below the root", v1alpha1.SandboxSpec{Mounts: mount(a + "/proc-root")}, "leads, through a symbolic link, outside"},
		{"refused: a path through a /proc magic link below the root", v1alpha1.SandboxSpec{Mounts: mount(a + "/proc-root/etc")}, "leads, through a symbolic link, outside"},
		{"allowed: passthrough of a name and of a prefix the class lists", v1alpha1.SandboxSpec{Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"TZ", "LC_ALL"}}}, ""},
		{"refused: passthrough the class does not list", v1alpha1.SandboxSpec{Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"TZ", "AWS_SECRET_ACCESS_KEY"}}}, `spec.env.passthrough[1]: SandboxClass "team-a" does not allow passing the controller's variable "AWS_SECRET_ACCESS_KEY" into commands (allowedEnv: [TZ, LC_*])`},
		{"refused: passthrough of the prefix's bare stem", v1alpha1.SandboxSpec{Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"LC"}}}, `"LC" into commands`},
		{"refused: too many mounts", v1alpha1.SandboxSpec{Mounts: []v1alpha1.Mount{{Source: a, Target: "a"}, {Source: a, Target: "b"}, {Source: a, Target: "c"}}}, `spec.mounts: SandboxClass "team-a" allows at most 2 mounts, the Sandbox has 3`},
		{"refused: devices.all", v1alpha1.SandboxSpec{Devices: v1alpha1.Devices{All: true}}, `spec.devices.all: SandboxClass "team-a" does not allow the host /dev`},
		{"refused: devices.usb", v1alpha1.SandboxSpec{Devices: v1alpha1.Devices{USB: true}}, `spec.devices.usb: SandboxClass "team-a" does not allow`},
		{"refused: backend", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendIncus, Incus: &v1alpha1.IncusSpec{Image: "x"}}, `spec.backend: SandboxClass "team-a" allows the backends [bwrap, containerd], not "incus"`},
		{"allowed: exact image", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("docker.io/library/alpine:3.20", "", 0)}, ""},
		{"allowed: image by prefix", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("registry.example.com/team-a/tools:1", "1Gi", 256)}, ""},
		{"refused: image", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("docker.io/library/alpine:latest", "", 0)}, `spec.containerd.image: SandboxClass "team-a" does not allow the image "docker.io/library/alpine:latest"`},
		{"refused: image of another prefix", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("registry.example.com/team-b/tools:1", "", 0)}, "does not allow the image"},
		{"allowed: a bwrap image by prefix", v1alpha1.SandboxSpec{Bwrap: &v1alpha1.BwrapSpec{Image: "registry.example.com/team-a/python:3"}}, ""},
		{"refused: a bwrap image of another prefix", v1alpha1.SandboxSpec{Bwrap: &v1alpha1.BwrapSpec{Image: "registry.example.com/team-b/python:3"}}, `spec.bwrap.image: SandboxClass "team-a" does not allow the image "registry.example.com/team-b/python:3" (allowed: [registry.example.com/team-a/*, python:*])`},
		{"allowed: a bwrap table without an image", v1alpha1.SandboxSpec{Bwrap: &v1alpha1.BwrapSpec{}}, ""},
		{"allowed: any tag of an image whose tags the class allows", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("ubuntu:24.04", "", 0)}, ""},
		{"allowed: a tag and a digest", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("ubuntu:24.04@sha256:"+strings.Repeat("a", 64), "", 0)}, ""},
		{"allowed: below a path prefix", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("registry.example.com/team-a/sub/tools:1", "", 0)}, ""},
		{"refused: a registry whose host and port read as the allowed image and a tag", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("ubuntu:5000/team-b/tools:1", "", 0)}, `spec.containerd.image: SandboxClass "team-a" does not allow the image "ubuntu:5000/team-b/tools:1"`},
		{"refused: the same for a bwrap image", v1alpha1.SandboxSpec{Bwrap: &v1alpha1.BwrapSpec{Image: "python:443/x/python:3"}}, `spec.bwrap.image: SandboxClass "team-a" does not allow the image "python:443/x/python:3"`},
		{"refused: memory above the maximum", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("docker.io/library/alpine:3.20", "2Gi", 0)}, `spec.containerd.memoryLimit: 2Gi is above the maximum 1Gi of SandboxClass "team-a"`},
		{"refused: a bwrap Sandbox's memory above the maximum", v1alpha1.SandboxSpec{Resources: &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("2Gi"))}}}, `spec.resources.limits.memory: 2Gi is above the maximum 1Gi of SandboxClass "team-a"`},
		{"refused: a bwrap Sandbox's pids above the maximum", v1alpha1.SandboxSpec{Resources: &v1alpha1.Resources{PidsLimit: ptr.To[int64](257)}}, `spec.resources.pidsLimit: 257 is above the maximum 256 of SandboxClass "team-a"`},
		{"refused: cpu above the maximum", v1alpha1.SandboxSpec{Resources: &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{CPU: ptr.To(resource.MustParse("3"))}}}, `spec.resources.limits.cpu: 3 is above the maximum 2 of SandboxClass "team-a"`},
		{"allowed: limits within the maximum", v1alpha1.SandboxSpec{Resources: &v1alpha1.Resources{PidsLimit: ptr.To[int64](100), Limits: v1alpha1.ResourceAmounts{CPU: ptr.To(resource.MustParse("500m")), Memory: ptr.To(resource.MustParse("256Mi"))}}}, ""},
		{"allowed: egress to listed hosts and below a listed wildcard", v1alpha1.SandboxSpec{Network: allow("github.com", "files.pythonhosted.org", "*.cdn.pythonhosted.org")}, ""},
		{"allowed: egress None whatever the class", v1alpha1.SandboxSpec{Network: &v1alpha1.Network{Egress: v1alpha1.EgressNone}}, ""},
		{"refused: egress to a host the class does not list", v1alpha1.SandboxSpec{Network: allow("github.com", "pypi.org")}, `spec.network.allow[1].host: SandboxClass "team-a" does not allow egress to "pypi.org" (allowedEgress: [github.com, *.pythonhosted.org])`},
		{"refused: egress to the domain of a wildcard", v1alpha1.SandboxSpec{Network: allow("pythonhosted.org")}, `does not allow egress to "pythonhosted.org"`},
		{"refused: egress to a wildcard wider than the class's name", v1alpha1.SandboxSpec{Network: allow("*.github.com")}, `does not allow egress to "*.github.com"`},
		{"refused: egress to an address", v1alpha1.SandboxSpec{Network: allow("140.82.112.3")}, `does not allow egress to "140.82.112.3"`},
		{"refused: pids above the maximum", v1alpha1.SandboxSpec{Backend: v1alpha1.BackendContainerd, Containerd: ctr("docker.io/library/alpine:3.20", "", 1000)}, `spec.containerd.pidsLimit: 1000 is above the maximum 256`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Agent = "alice"
			before := spec.DeepCopy()
			out, v := Effective(class(dir), &spec, Node{Home: filepath.Join(dir, "home/alice")})
			if tc.want == "" {
				if len(v) > 0 || out == nil {
					t.Fatalf("refused: %v", v)
				}
			} else if len(v) == 0 || !strings.Contains(v[0], tc.want) || out != nil {
				t.Fatalf("violations %q, want the first containing %q", v, tc.want)
			}
			if spec.Backend != before.Backend || len(spec.Mounts) != len(before.Mounts) || (len(spec.Mounts) > 0 && spec.Mounts[0] != before.Mounts[0]) {
				t.Fatalf("the Sandbox's spec was changed: %+v", spec)
			}
		})
	}
}

func TestEffectiveKeepsTheSourceAsWrittenAndAppliesLimits(t *testing.T) {
	dir := tree(t)
	a := filepath.Join(dir, "srv/projects/team-a")
	spec := &v1alpha1.SandboxSpec{Agent: "alice", Backend: v1alpha1.BackendContainerd,
		Containerd: &v1alpha1.ContainerdSpec{Image: "docker.io/library/alpine:3.20"},
		Mounts:     []v1alpha1.Mount{{Source: a + "/self", Target: "p"}}}
	out, v := Effective(class(dir), spec, Node{})
	if len(v) > 0 {
		t.Fatal(v)
	}
	// Every act resolves the source again beneath its root (areas.HostDir),
	// so the spec keeps it as written, not a string resolved once.
	if out.Mounts[0].Source != a+"/self" {
		t.Errorf("source %q, want %q as written", out.Mounts[0].Source, a+"/self")
	}
	// The class's limits apply to every backend, through spec.resources.
	if out.Resources == nil || out.Resources.Limits.Memory == nil || out.Resources.Limits.Memory.String() != "512Mi" {
		t.Errorf("resources %+v, want the class default memory limit 512Mi", out.Resources)
	}
	if out.Resources == nil || out.Resources.PidsLimit == nil || *out.Resources.PidsLimit != 256 {
		t.Errorf("resources %+v, want the class maximum pids limit 256 (no default)", out.Resources)
	}
	if spec.Containerd.MemoryLimit != nil || spec.Mounts[0].Source != a+"/self" {
		t.Errorf("the Sandbox's spec was changed: %+v", spec)
	}
}

func TestSelect(t *testing.T) {
	mk := func(name string, def bool) v1alpha1.SandboxClass {
		c := v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if def {
			c.Labels = map[string]string{v1alpha1.DefaultClassLabel: "true"}
		}
		return c
	}
	for _, tc := range []struct {
		name      string
		classes   []v1alpha1.SandboxClass
		className string
		want, msg string
	}{
		{"no classes: none applies", nil, "", "", ""},
		{"no classes: a named one is missing", nil, "x", "", `SandboxClass "x" does not exist`},
		{"named", []v1alpha1.SandboxClass{mk("a", true), mk("b", false)}, "b", "b", ""},
		{"named but missing", []v1alpha1.SandboxClass{mk("a", true)}, "b", "", `SandboxClass "b" does not exist`},
		{"the default", []v1alpha1.SandboxClass{mk("a", false), mk("b", true)}, "", "b", ""},
		{"classes but no default", []v1alpha1.SandboxClass{mk("a", false)}, "", "", "none is marked default"},
		{"two defaults", []v1alpha1.SandboxClass{mk("b", true), mk("a", true)}, "", "", "2 SandboxClasses are marked default (a, b)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, msg := Select(tc.classes, &v1alpha1.SandboxSpec{ClassName: tc.className})
			got := ""
			if c != nil {
				got = c.Name
			}
			if got != tc.want || (tc.msg == "") != (msg == "") || !strings.Contains(msg, tc.msg) {
				t.Fatalf("class %q, message %q; want %q, %q", got, msg, tc.want, tc.msg)
			}
		})
	}
}

func TestAgentIDs(t *testing.T) {
	ctl := areas.IDRange{First: 2000000000, Count: 65536}
	c := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}
	for _, tc := range []struct {
		name, ids string
		want      areas.IDRange
		msg       string
	}{
		{"none: the controller's range", "", ctl, ""},
		{"inside", "2000001000:100", areas.IDRange{First: 2000001000, Count: 100}, ""},
		{"the whole range", "2000000000:65536", ctl, ""},
		{"reaching past the end", "2000065500:100", areas.IDRange{}, "does not hand out (--agent-ids 2000000000:65536)"},
		{"below", "1000:10", areas.IDRange{}, "does not hand out"},
		{"including 0", "0:10", areas.IDRange{}, "includes 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.Spec.AgentIDs = tc.ids
			got, msg := AgentIDs(c, ctl)
			if got != tc.want || (tc.msg == "") != (msg == "") || !strings.Contains(msg, tc.msg) {
				t.Fatalf("%v, %q; want %v, %q", got, msg, tc.want, tc.msg)
			}
		})
	}
	if msg := CheckAgentID(c, areas.IDRange{First: 10, Count: 5}, "alice", 15); !strings.Contains(msg, `agent "alice" runs as host id 15, outside the ids 10:5`) {
		t.Errorf("CheckAgentID: %q", msg)
	}
	if msg := CheckAgentID(c, areas.IDRange{First: 10, Count: 5}, "alice", 14); msg != "" {
		t.Errorf("CheckAgentID of an id inside: %q", msg)
	}
}

func TestScheduling(t *testing.T) {
	class := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: v1alpha1.SandboxClassSpec{
		Scheduling: v1alpha1.ClassScheduling{AllowedPriorityClassNames: []string{"batch"}, AllowedTolerations: []string{"gpu"}}}}
	anti := &v1alpha1.Affinity{PodAntiAffinity: &v1alpha1.PodAffinity{}}
	for _, tc := range []struct {
		name string
		spec v1alpha1.SandboxSpec
		want []string
	}{
		{name: "nothing asked", spec: v1alpha1.SandboxSpec{NodeSelector: map[string]string{"zone": "a"}, Affinity: &v1alpha1.Affinity{NodeAffinity: &v1alpha1.NodeAffinity{}}}},
		{name: "allowed", spec: v1alpha1.SandboxSpec{PriorityClassName: "batch", Tolerations: []v1alpha1.Toleration{{Key: "gpu", Operator: "Exists"}}}},
		{name: "another priority", spec: v1alpha1.SandboxSpec{PriorityClassName: "system-node-critical"},
			want: []string{`spec.priorityClassName: SandboxClass "team-a" does not allow the PriorityClass "system-node-critical" (scheduling.allowedPriorityClassNames: [batch])`}},
		{name: "another key, and every taint", spec: v1alpha1.SandboxSpec{Tolerations: []v1alpha1.Toleration{{Key: "gpu"}, {Key: "dedicated"}, {Operator: "Exists"}}},
			want: []string{
				`spec.tolerations[1]: SandboxClass "team-a" does not allow tolerating the taint key "dedicated" (scheduling.allowedTolerations: [gpu])`,
				`spec.tolerations[2]: SandboxClass "team-a" does not allow tolerating every taint (scheduling.allowedTolerations: [gpu])`,
			}},
		{name: "anti-affinity", spec: v1alpha1.SandboxSpec{Affinity: anti},
			want: []string{`spec.affinity.podAntiAffinity: SandboxClass "team-a" does not allow affinity or anti-affinity to other Pods (scheduling.podAffinity)`}},
		{name: "pinned", spec: v1alpha1.SandboxSpec{NodeName: "node-a"},
			want: []string{`spec.nodeName: SandboxClass "team-a" does not allow pinning a Sandbox to a node (scheduling.nodeName)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Scheduling(class, &tc.spec)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
	all := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "all"}, Spec: v1alpha1.SandboxClassSpec{Scheduling: v1alpha1.ClassScheduling{
		AllowedPriorityClassNames: []string{"*"}, AllowedTolerations: []string{"*"}, PodAffinity: true, NodeName: true}}}
	spec := v1alpha1.SandboxSpec{PriorityClassName: "high", Tolerations: []v1alpha1.Toleration{{Operator: "Exists"}}, Affinity: anti, NodeName: "node-a"}
	if got := Scheduling(all, &spec); len(got) != 0 {
		t.Errorf("a class allowing all refused: %v", got)
	}
}

func TestIncusProfiles(t *testing.T) {
	class := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: v1alpha1.SandboxClassSpec{
		AllowedBackends: []v1alpha1.Backend{v1alpha1.BackendIncus}, AllowedImages: v1alpha1.ClassImages{Incus: []string{"*"}},
		AllowedIncusProfiles: []string{"quota"}}}
	spec := func(profiles ...string) *v1alpha1.SandboxSpec {
		return &v1alpha1.SandboxSpec{Agent: "alice", Backend: v1alpha1.BackendIncus, Incus: &v1alpha1.IncusSpec{Image: "debian", Profiles: profiles}}
	}
	if _, v := Effective(class, spec(), Node{}); len(v) != 0 {
		t.Errorf("no profile named (the server's default): %v", v)
	}
	if _, v := Effective(class, spec("quota"), Node{}); len(v) != 0 {
		t.Errorf("a listed profile: %v", v)
	}
	_, v := Effective(class, spec("quota", "privileged-ci"), Node{})
	want := `spec.incus.profiles[1]: SandboxClass "team-a" does not allow the Incus profile "privileged-ci" (allowedIncusProfiles: [quota])`
	if len(v) != 1 || v[0] != want {
		t.Errorf("got %q, want %q", v, want)
	}
	class.Spec.AllowedIncusProfiles = []string{"*"}
	if _, v := Effective(class, spec("privileged-ci"), Node{}); len(v) != 0 {
		t.Errorf("a class allowing any profile: %v", v)
	}
}

// A request the class's default or maximum limit is below, or a limit
// below the class's default request, is refused in words that name the
// field, the amounts and where each came from: applied as they are, the
// request would be above the limit, which the spec alone may not ask.
func TestEffectiveRefusesARequestAboveTheLimitTheClassGives(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	cls := &v1alpha1.SandboxClass{ObjectMeta: metav1.ObjectMeta{Name: "small"}, Spec: v1alpha1.SandboxClassSpec{
		AllowedBackends:  []v1alpha1.Backend{v1alpha1.BackendBwrap},
		DefaultResources: &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{CPU: q("1")}, Requests: v1alpha1.ResourceAmounts{Memory: q("1Gi")}},
		MaxResources:     &v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{Memory: q("4Gi")}},
	}}
	for _, tc := range []struct {
		name string
		res  v1alpha1.Resources
		want string
	}{
		{"a request above the default limit", v1alpha1.Resources{Requests: v1alpha1.ResourceAmounts{CPU: q("1000")}},
			`spec.resources.requests.cpu: 1k is above the limit 1, the default of SandboxClass "small" (defaultResources.limits.cpu); set spec.resources.limits.cpu too`},
		{"a limit below the default request", v1alpha1.Resources{Limits: v1alpha1.ResourceAmounts{Memory: q("512Mi")}},
			`spec.resources.limits.memory: 512Mi is below the request 1Gi, the default of SandboxClass "small" (defaultResources.requests.memory); set spec.resources.requests.memory too`},
		{"a request above the maximum limit given", v1alpha1.Resources{Requests: v1alpha1.ResourceAmounts{Memory: q("8Gi")}},
			`spec.resources.requests.memory: 8Gi is above the limit 4Gi, the maximum of SandboxClass "small" (maxResources.limits.memory, which applies when it gives no default); set spec.resources.limits.memory too`},
		{"within both", v1alpha1.Resources{Requests: v1alpha1.ResourceAmounts{CPU: q("500m")}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.res
			spec := &v1alpha1.SandboxSpec{Agent: "alice", Resources: &res}
			_, v := Effective(cls, spec, Node{})
			got := strings.Join(v, "; ")
			if got != tc.want {
				t.Errorf("refused %q, want %q", got, tc.want)
			}
		})
	}
}
