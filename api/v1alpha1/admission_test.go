package v1alpha1_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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
		Entry("backend incus without the incus table", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendIncus
		}, v1alpha1.MsgIncusRequired),
		Entry("backend containerd without the containerd table", func(s *v1alpha1.SandboxSpec) {
			s.Backend = v1alpha1.BackendContainerd
		}, v1alpha1.MsgContainerdRequired),
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

	It("accepts sibling mount targets that share a name prefix", func() {
		sb := sandbox(func(s *v1alpha1.SandboxSpec) {
			s.Mounts = []v1alpha1.Mount{mount("/srv/a", "app", "ro"), mount("/srv/b", "app2", "rw"), mount("/srv/c", "lib/app", "rw")}
		})
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		Expect(strings.Join([]string{sb.Spec.Mounts[0].Target, sb.Spec.Mounts[1].Target}, ",")).To(Equal("app,app2"))
	})
})
