package v1alpha1_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

var seq int

func sandbox(mut func(*v1alpha1.SandboxSpec)) *v1alpha1.Sandbox {
	seq++
	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sb-%d", seq), Namespace: "default"},
		Spec:       v1alpha1.SandboxSpec{Agent: fmt.Sprintf("agent-%d", seq)},
	}
	if mut != nil {
		mut(&sb.Spec)
	}
	return sb
}

func allowlist(hosts ...string) *v1alpha1.Network {
	n := &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist}
	for _, h := range hosts {
		n.Allow = append(n.Allow, v1alpha1.EgressRule{Host: h})
	}
	return n
}

func mount(src, target string, mode v1alpha1.MountMode) v1alpha1.Mount {
	return v1alpha1.Mount{Source: src, Target: target, Mode: mode}
}

var _ = Describe("Sandbox admission", func() {
	It("accepts the seed's own sample (bwrap, git and python3, a rw project mount)", func() {
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendBwrap
			s.Binaries = []v1alpha1.BinaryName{"git", "python3"}
			s.Mounts = []v1alpha1.Mount{mount("/home/user/projects/my-app", "project", "rw")}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(sb.Spec.Mounts[0].Mode).To(Equal(v1alpha1.MountReadWrite))
	})

	It("accepts the seed's incus sample and defaults shutdownOnExit to true", func() {
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendIncus
			s.Incus = &v1alpha1.IncusSpec{Image: "images:fedora/42", Profiles: []string{}}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(sb.Spec.Incus.ShutdownOnExit).To(Equal(ptr.To(true)))
	})

	It("accepts an egress allowlist of names, wildcards, addresses and ports, and defaults egress to None", func() {
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("github.com", "*.pythonhosted.org", "192.0.2.10", "2001:db8::1")
			s.Network.Allow[0].Ports = []int32{443, 22}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(v1alpha1.ValidateSandboxSpec(&sb.Spec)).To(BeEmpty())
		none := sandbox(func(s *v1alpha1.SandboxSpec) { s.Network = &v1alpha1.Network{} })
		Expect(k8s.Create(ctx, none)).To(Succeed())
		Expect(none.Spec.Network.Egress).To(Equal(v1alpha1.EgressNone))
		bad := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("github.com")
			s.Network.Allow[0].Ports = []int32{0}
		})
		Expect(k8s.Create(ctx, bad)).To(MatchError(ContainSubstring("spec.network.allow[0].ports[0]")))
		Expect(v1alpha1.ValidateSandboxSpec(&bad.Spec).ToAggregate()).To(MatchError(ContainSubstring(v1alpha1.MsgEgressPort)))
	})

	It("defaults backend to bwrap, mount mode to ro and idleTimeout to 5m", func() {
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{{Source: "~/notes", Target: "notes"}}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(sb.Spec.Backend).To(Equal(v1alpha1.BackendBwrap))
		Expect(sb.Spec.Mounts[0].Mode).To(Equal(v1alpha1.MountReadOnly))
		Expect(sb.Spec.IdleTimeout.Duration.String()).To(Equal("5m0s"))
	})

	DescribeTable("rejects each broken rule with its own message",
		func(mut func(*v1alpha1.SandboxSpec), msg string) {
			err := k8s.Create(ctx, sandbox(mut))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(msg))
			// The Go rules used by the sandbox.toml loader agree, word for word.
			spec := sandbox(mut).Spec
			Expect(v1alpha1.ValidateSandboxSpec(&spec).ToAggregate().Error()).To(ContainSubstring(msg))
		},
		Entry("egress host with an uppercase letter", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("GitHub.com")
		}, v1alpha1.MsgEgressHost),
		Entry("egress host of one label", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("localhost")
		}, v1alpha1.MsgEgressHost),
		Entry("egress wildcard not first", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("pypi.*.org")
		}, v1alpha1.MsgEgressHost),
		Entry("egress host with a port in it", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("github.com:22")
		}, v1alpha1.MsgEgressHost),
		Entry("egress host a URL", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("https://github.com")
		}, v1alpha1.MsgEgressHost),
		Entry("egress IPv6 address with a zone", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("fe80::1%eth0")
		}, v1alpha1.MsgEgressHost),
		Entry("allow entries without egress Allowlist", func(s *v1alpha1.SandboxSpec) {
			s.Network = allowlist("github.com")
			s.Network.Egress = v1alpha1.EgressNone
		}, v1alpha1.MsgEgressAllowOnly),
		Entry("egress Allowlist without entries", func(s *v1alpha1.SandboxSpec) {
			s.Network = &v1alpha1.Network{Egress: v1alpha1.EgressAllowlist}
		}, v1alpha1.MsgEgressNoAllow),
		Entry("mount source relative", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("projects/app", "app", "ro")}
		}, v1alpha1.MsgMountSource),
		Entry("mount source ~user/ (only ~/ is allowed)", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("~bob/app", "app", "ro")}
		}, v1alpha1.MsgMountSource),
		Entry("mount target absolute", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "/workspace/app", "ro")}
		}, v1alpha1.MsgMountTargetAbs),
		Entry("mount target with ..", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "app/../../etc", "ro")}
		}, v1alpha1.MsgMountTargetDots),
		Entry("mount target with .", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "./app", "ro")}
		}, v1alpha1.MsgMountTargetDots),
		Entry("mount target with an empty segment", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "a//b", "ro")}
		}, v1alpha1.MsgMountTargetEmpty),
		Entry("mount target with a trailing slash", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "app/", "ro")}
		}, v1alpha1.MsgMountTargetEmpty),
		Entry("mount mode neither ro nor rw", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "app", "rwx")}
		}, v1alpha1.MsgMountMode),
		Entry("sizeLimit on a mount that is not an overlay", func(s *v1alpha1.SandboxSpec) {
			m := mount("/srv/app", "app", "rw")
			m.SizeLimit = ptr.To(resource.MustParse("1Gi"))
			s.Mounts = []v1alpha1.Mount{m}
		}, v1alpha1.MsgMountSizeLimit),
		Entry("mount targets equal", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/a", "app", "ro"), mount("/srv/b", "app", "rw")}
		}, v1alpha1.MsgMountOverlap),
		Entry("mount target nested below another", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/a", "app", "ro"), mount("/srv/b", "app/data", "rw")}
		}, v1alpha1.MsgMountOverlap),
		Entry("binary with a space", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"git status"}
		}, v1alpha1.MsgBinarySpace),
		Entry("binary with a slash", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"/usr/bin/git"}
		}, v1alpha1.MsgBinarySlash),
		Entry("agent not a DNS-1123 label", func(s *v1alpha1.SandboxSpec) {
			s.Agent = "Alice_1"
		}, v1alpha1.MsgAgentLabel),
		Entry("passthrough variable name invalid", func(s *v1alpha1.SandboxSpec) {
			s.Env.Passthrough = []v1alpha1.EnvVarName{"1BAD"}
		}, v1alpha1.MsgEnvName),
	)

	It("rejects every shell metacharacter in a binary name, naming the rule", func() {
		for _, r := range v1alpha1.ShellMetacharacters {
			name := "py" + string(r) + "thon"
			err := k8s.Create(ctx, sandbox(func(s *v1alpha1.SandboxSpec) { s.Binaries = []v1alpha1.BinaryName{v1alpha1.BinaryName(name)} }))
			Expect(err).To(HaveOccurred(), "metacharacter %q", string(r))
			Expect(err.Error()).To(ContainSubstring(v1alpha1.MsgBinaryMeta), "metacharacter %q", string(r))
			Expect(v1alpha1.CheckBinaryName(name)).To(Equal(v1alpha1.MsgBinaryMeta), "metacharacter %q", string(r))
		}
	})

	It("keeps agent and backend immutable", func() {
		sb := sandbox(nil)
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		changed := sb.DeepCopy()
		changed.Spec.Agent = "someone-else"
		err := k8s.Update(ctx, changed)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(v1alpha1.MsgAgentImmutable))

		changed = sb.DeepCopy()
		changed.Spec.Backend = v1alpha1.BackendContainerd
		changed.Spec.Containerd = &v1alpha1.ContainerdSpec{Image: "busybox"}
		err = k8s.Update(ctx, changed)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(v1alpha1.MsgBackendImmutable))
	})

	It("keeps a claim's sandboxName immutable", func() {
		c := &v1alpha1.SessionClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-immutable", Namespace: "default"},
			Spec:       v1alpha1.SessionClaimSpec{SandboxName: "a", Session: "s"},
		}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		c.Spec.SandboxName = "b"
		err := k8s.Update(ctx, c)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(v1alpha1.MsgSandboxNameImmut))
	})

	// A backend's own rules are the backend registry's in Go
	// (bridge/backend, whose tests hold the same messages), which the API
	// cannot import: here only the CEL side.
	DescribeTable("rejects a backend without its table with the backend's message",
		func(mut func(*v1alpha1.SandboxSpec), msg string) {
			err := k8s.Create(ctx, sandbox(mut))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(msg))
		},
		Entry("backend incus without the incus table", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendIncus
		}, v1alpha1.MsgIncusRequired),
		Entry("backend containerd without the containerd table", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendContainerd
		}, v1alpha1.MsgContainerdRequired),
	)

	// Issue 15: what Go would fail to decode or misread, and names that
	// read differently from what they are. celMsg is what kubectl shows;
	// goMsg what the controller (InvalidSpec) and sandbox.toml say, the same
	// words unless the Go type cannot hold the value as written.
	DescribeTable("refuses loose input with a message naming the field and the rule",
		func(mut func(*v1alpha1.SandboxSpec), celMsg, goMsg string) {
			err := k8s.Create(ctx, sandbox(mut))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(celMsg))
			spec := sandbox(mut).Spec
			Expect(v1alpha1.ValidateSandboxSpec(&spec).ToAggregate().Error()).To(ContainSubstring(goMsg))
		},
		Entry("mount source ~/ climbing out of the home directory", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("~/../../etc", "etc", "ro")}
		}, v1alpha1.MsgMountSourceDots, v1alpha1.MsgMountSourceDots),
		Entry("mount source absolute with a .. segment", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app/../../etc", "etc", "ro")}
		}, v1alpha1.MsgMountSourceDots, v1alpha1.MsgMountSourceDots),
		Entry("mount source with a right-to-left override", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/\u202eppa", "app", "ro")}
		}, v1alpha1.MsgMountSourceChars, v1alpha1.MsgMountSourceChars),
		Entry("mount source with a NUL", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/a\x00b", "app", "ro")}
		}, v1alpha1.MsgMountSourceChars, v1alpha1.MsgMountSourceChars),
		Entry("mount target with a zero-width space", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "app\u200b", "ro")}
		}, v1alpha1.MsgMountTargetChars, v1alpha1.MsgMountTargetChars),
		Entry("mount target with a newline", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "a\nb", "ro")}
		}, v1alpha1.MsgMountTargetChars, v1alpha1.MsgMountTargetChars),
		Entry("mount target with a line separator", func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/app", "a\u2028b", "ro")}
		}, v1alpha1.MsgMountTargetChars, v1alpha1.MsgMountTargetChars),
		Entry("binary starting with '-' (an option)", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"-rf"}
		}, v1alpha1.MsgBinaryPortable, v1alpha1.MsgBinaryPortable),
		Entry("binary starting with '.'", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{".hidden"}
		}, v1alpha1.MsgBinaryPortable, v1alpha1.MsgBinaryPortable),
		Entry("binary with a NUL", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"git\x00"}
		}, v1alpha1.MsgBinaryPortable, v1alpha1.MsgBinaryPortable),
		Entry("binary with a zero-width joiner", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"gi\u200dt"}
		}, v1alpha1.MsgBinaryPortable, v1alpha1.MsgBinaryPortable),
		Entry("binary with a right-to-left override", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"\u202etig"}
		}, v1alpha1.MsgBinaryPortable, v1alpha1.MsgBinaryPortable),
		Entry("binary with a letter outside ASCII", func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"g\u00eft"}
		}, v1alpha1.MsgBinaryPortable, v1alpha1.MsgBinaryPortable),
		Entry("agent with a zero-width space", func(s *v1alpha1.SandboxSpec) {
			s.Agent = "alice\u200b"
		}, v1alpha1.MsgAgentLabel, v1alpha1.MsgAgentLabel),
		Entry("idleTimeout zero", func(s *v1alpha1.SandboxSpec) {
			s.IdleTimeout = &metav1.Duration{}
		}, v1alpha1.MsgIdleTimeoutRange, v1alpha1.MsgIdleTimeoutRange),
		Entry("idleTimeout negative", func(s *v1alpha1.SandboxSpec) {
			s.IdleTimeout = &metav1.Duration{Duration: -5 * time.Minute}
		}, v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutRange),
		Entry("idleTimeout above 30 days", func(s *v1alpha1.SandboxSpec) {
			s.IdleTimeout = &metav1.Duration{Duration: 721 * time.Hour}
		}, v1alpha1.MsgIdleTimeoutRange, v1alpha1.MsgIdleTimeoutRange),
		Entry("pidsLimit zero", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendContainerd
			s.Containerd = &v1alpha1.ContainerdSpec{Image: "busybox", PidsLimit: ptr.To[int64](0)}
		}, v1alpha1.MsgPidsLimit, v1alpha1.MsgPidsLimit),
		Entry("pidsLimit above the kernel's pid_max", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendContainerd
			s.Containerd = &v1alpha1.ContainerdSpec{Image: "busybox", PidsLimit: ptr.To[int64](v1alpha1.MaxPidsLimit + 1)}
		}, v1alpha1.MsgPidsLimit, v1alpha1.MsgPidsLimit),
		Entry("memoryLimit zero (the runtime would read no limit)", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendContainerd
			s.Containerd = &v1alpha1.ContainerdSpec{Image: "busybox", MemoryLimit: ptr.To(resource.MustParse("0"))}
		}, v1alpha1.MsgMemoryPositive, v1alpha1.MsgMemoryPositive),
		Entry("rootfsSizeLimit negative", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendContainerd
			s.Containerd = &v1alpha1.ContainerdSpec{Image: "busybox", RootfsSizeLimit: ptr.To(resource.MustParse("-1Gi"))}
		}, v1alpha1.MsgRootfsPositive, v1alpha1.MsgRootfsPositive),
		Entry("incus rootSizeLimit zero", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendIncus
			s.Incus = &v1alpha1.IncusSpec{Image: "images:fedora/42", RootSizeLimit: ptr.To(resource.MustParse("0Gi"))}
		}, v1alpha1.MsgRootPositive, v1alpha1.MsgRootPositive),
		Entry("restartPolicy not one of its values", func(s *v1alpha1.SandboxSpec) {
			s.RestartPolicy = "Sometimes"
		}, `Unsupported value: "Sometimes"`, `Unsupported value: "Sometimes"`),
	)

	// Values the Go type cannot even hold go in as JSON; the controller
	// decodes them field by field and says the same (decode.go).
	DescribeTable("refuses an idleTimeout Go would fail to decode or misread",
		func(value any, celMsg, goMsg string) {
			seq++
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Sandbox",
				"metadata": map[string]any{"name": fmt.Sprintf("sb-raw-%d", seq), "namespace": "default"},
				"spec":     map[string]any{"agent": fmt.Sprintf("agent-raw-%d", seq), "idleTimeout": value},
			}}
			err := k8s.Create(ctx, u)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(celMsg))
			raw, err := json.Marshal(u.Object["spec"])
			Expect(err).NotTo(HaveOccurred())
			var spec v1alpha1.SandboxSpec
			Expect(json.Unmarshal(raw, &spec)).To(Succeed())
			if goMsg == "" {
				Expect(v1alpha1.ValidateSandboxSpec(&spec)).To(BeEmpty())
				return
			}
			Expect(v1alpha1.ValidateSandboxSpec(&spec).ToAggregate().Error()).To(ContainSubstring(goMsg))
		},
		Entry("banana", "banana", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutFormat),
		Entry("-5m", "-5m", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutRange),
		Entry("99999999999h (overflows)", "99999999999h", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutFormat),
		Entry("999999h999999h999999h (too long, would overflow)", "999999h999999h999999h", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutFormat),
		Entry("5 minutes", "5 minutes", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutFormat),
		Entry("empty", "", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutFormat),
		// The CEL format is narrower than Go's syntax, so that duration()
		// never fails; Go decodes the micro sign and the value is in range.
		Entry("1\u00b5s (the micro sign)", "1\u00b5s", v1alpha1.MsgIdleTimeoutFormat, ""),
		Entry("0", "0", v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutRange),
		Entry("999999h (fits, above 30 days)", "999999h", v1alpha1.MsgIdleTimeoutRange, v1alpha1.MsgIdleTimeoutRange),
	)

	// The schema walk takes format date-time as metav1.Time's rule and
	// bounds as int32's: the API server must enforce both on status too.
	It("refuses a status time that is not a date-time and a count outside int32", func() {
		sb := sandbox(nil)
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Sandbox"))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sb), u)).To(Succeed())
		Expect(unstructured.SetNestedField(u.Object, "banana", "status", "idleSince")).To(Succeed())
		err := k8s.Status().Update(ctx, u)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("status.idleSince"))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sb), u)).To(Succeed())
		Expect(unstructured.SetNestedField(u.Object, int64(3000000000), "status", "claims")).To(Succeed())
		err = k8s.Status().Update(ctx, u)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("status.claims"))
	})

	It("admits durations, binaries and sources at the edges of the rules", func() {
		for _, d := range []string{"30s", "1h30m", "720h", "1.5h", "43200m", ".5h", "719h59m59.999999s"} {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Sandbox",
				"metadata": map[string]any{"generateName": "sb-edge-", "namespace": "default"},
				"spec":     map[string]any{"agent": "agent-edge", "idleTimeout": d},
			}}
			Expect(k8s.Create(ctx, u)).To(Succeed(), "idleTimeout %q", d)
		}
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Binaries = []v1alpha1.BinaryName{"g++", "python3.12", "x86_64-linux-gnu-gcc", "_helper"}
			s.Mounts = []v1alpha1.Mount{mount("~/projects/..app", "app", "ro"), mount("/srv/caf\u00e9", "caf\u00e9 au lait", "ro")}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(v1alpha1.ValidateSandboxSpec(&sb.Spec)).To(BeEmpty())
	})

	It("accepts sibling mount targets that share a name prefix", func() {
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/a", "app", "ro"), mount("/srv/b", "app2", "rw"), mount("/srv/c", "lib/app", "rw")}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(strings.Join([]string{sb.Spec.Mounts[0].Target, sb.Spec.Mounts[1].Target}, ",")).To(Equal("app,app2"))
	})
})
