//go:build e2e

package incus_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

var _ = Describe("Incus mount destinations against the agent", func() {
	// The attack of issue 12 on this backend: the agent turns the path of
	// the first custom mount's destination into links (src -> stage,
	// stage/app -> a host directory holding the second mount's source) and
	// plants a link to / in the first mount's source. At the next start
	// LXC opens each component of a disk device's destination beneath the
	// container's root without following links (open_without_symlink), so
	// the start is refused; the driver says why.
	It("refuses to start with a link on a custom mount's destination path and binds nothing where it leads", func() {
		ns := env.NewNamespace()
		hostDir := filepath.Join(env.Dir, ns+"-host")
		secret := filepath.Join(hostDir, "secret")
		appSrc := filepath.Join(hostDir, "app")
		toolsParent := filepath.Join(hostDir, "tools-parent")
		toolsSrc := filepath.Join(toolsParent, "tools")
		for _, dir := range []string{appSrc, toolsSrc} {
			Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		}
		Expect(os.WriteFile(secret, []byte("HOST-SECRET\n"), 0o600)).To(Succeed())
		sb := newSandbox(ns, "linked")
		sb.Spec.Binaries = append(sb.Spec.Binaries, "mv", "ln", "mkdir", "rm", "ls")
		sb.Spec.Mounts = []v1alpha1.Mount{
			{Source: appSrc, Target: "src/app", Mode: v1alpha1.MountReadWrite},
			{Source: toolsSrc, Target: "tools", Mode: v1alpha1.MountReadWrite},
		}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(sb) })
		Expect(k8s.Create(ctx, newClaim(ns, "c1", "linked"))).To(Succeed())
		Eventually(sandboxStatus(ns, "linked"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)
		giveTo(sb, appSrc)
		giveTo(sb, toolsSrc)

		code, out := run(name, fmt.Sprintf(`set -e; mv /workspace/src /workspace/src.moved; mkdir -p /workspace/stage; `+
			`ln -s %[1]s /workspace/stage/app; ln -sfn stage /workspace/src; ln -s / /workspace/src.moved/app/tools`, toolsParent))
		Expect(code).To(Equal(0), out)
		noEscape := func() {
			GinkgoHelper()
			_, out := run(name, fmt.Sprintf(`cat /workspace/tools%[1]s %[1]s /workspace/src/app/tools%[1]s; echo owned > /workspace/tools%[2]s/planted`, secret, hostDir))
			Expect(out).NotTo(ContainSubstring("HOST-SECRET"))
			Expect(filepath.Join(hostDir, "planted")).NotTo(BeAnExistingFile())
			Expect(isMountPoint(toolsParent)).To(BeFalse(), "a bind landed on the host where a link pointed")
			Expect(isMountPoint(toolsSrc)).To(BeFalse(), "a bind landed on the host where a link pointed")
		}
		By("commands in the running instance see nothing of the host")
		noEscape()

		By("the next start is refused, naming the link")
		env.DeleteAndWait(newClaim(ns, "c1", "linked"))
		Eventually(sandboxStatus(ns, "linked"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(k8s.Create(ctx, newClaim(ns, "c2", "linked"))).To(Succeed())
		Eventually(sandboxStatus(ns, "linked"), timeout).Should(HaveField("Conditions",
			ContainElement(HaveField("Message", ContainSubstring("symbolic link")))))
		// The controller retries the start; incusd reports an attempt as
		// running until LXC refuses the mount, so the instance is not
		// running once no attempt is under way.
		Eventually(func() bool { return inspect(name).Running }, timeout).Should(BeFalse())
		Expect(isMountPoint(toolsParent)).To(BeFalse())
		Expect(filepath.Join(hostDir, "planted")).NotTo(BeAnExistingFile())

		By("repaired from the host, the instance starts with every mount at its destination")
		ws := areaPath(sb, "workspace")
		Expect(os.Remove(filepath.Join(ws, "src"))).To(Succeed())
		Expect(os.RemoveAll(filepath.Join(ws, "stage"))).To(Succeed())
		Expect(os.Rename(filepath.Join(ws, "src.moved"), filepath.Join(ws, "src"))).To(Succeed())
		Expect(os.Remove(filepath.Join(appSrc, "tools"))).To(Succeed())
		nudge(sb)
		Eventually(sandboxStatus(ns, "linked"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		// Right after a start Incus may not have the init's pid for an exec yet.
		Eventually(func() (int, error) {
			var b strings.Builder
			st, err := rt().Exec(ctx, name, runtimes.ExecRequest{Argv: []string{"sh", "-c", `echo ok > /workspace/src/app/back && echo ok > /workspace/tools/back`}, Stdout: &b, Stderr: &b})
			return st.Code, err
		}, timeout).Should(Equal(0))
		Expect(os.ReadFile(filepath.Join(appSrc, "back"))).To(Equal([]byte("ok\n")))
		Expect(os.ReadFile(filepath.Join(toolsSrc, "back"))).To(Equal([]byte("ok\n")))
		noEscape()
	})
})

// isMountPoint says whether p is a mount point in this process's mount
// namespace: its mount is not its parent's.
func isMountPoint(p string) bool {
	var st, parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		return false
	}
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(p), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &parent); err != nil {
		return false
	}
	return st.Mnt_id != parent.Mnt_id
}

var _ = Describe("Incus agents against the host and each other", func() {
	// An agent inside an Incus container once kept every capability in its
	// bounding set, could gain privileges (no_new_privs 0) and create user
	// namespaces holding every capability, and all containers shared one
	// host id range: root of one container planted a setuid binary in a
	// mount source two Sandboxes share, and the other's agent ran it as its
	// container's root.
	It("gives agent commands no capabilities, no_new_privs and no user namespaces, and each instance ids of its own", func() {
		ns := env.NewNamespace()
		shared := filepath.Join(env.Dir, ns+"-shared")
		Expect(os.MkdirAll(shared, 0o777)).To(Succeed())
		Expect(os.Chmod(shared, 0o777)).To(Succeed())
		var names []string
		var sbs []*v1alpha1.Sandbox
		for _, n := range []string{"hard-a", "hard-b"} {
			sb := newSandbox(ns, n)
			sb.Spec.Binaries = append(sb.Spec.Binaries, "grep", "unshare", "cp", "chmod")
			sb.Spec.Mounts = []v1alpha1.Mount{{Source: shared, Target: "shared", Mode: v1alpha1.MountReadWrite}}
			Expect(k8s.Create(ctx, sb)).To(Succeed())
			DeferCleanup(func() { env.DeleteAndWait(sb) })
			Expect(k8s.Create(ctx, newClaim(ns, n+"-claim", n))).To(Succeed())
			sbs = append(sbs, sb)
			names = append(names, instanceOf(sb))
		}
		for _, n := range []string{"hard-a", "hard-b"} {
			Eventually(sandboxStatus(ns, n), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		}

		By("the agent's commands hold no capability, cannot gain one and make no user namespace")
		code, out := run(names[0], `grep -E '^(CapPrm|CapEff|CapBnd|NoNewPrivs):' /proc/self/status; unshare -U -r true && echo USERNS-MADE || echo no-userns`)
		Expect(code).To(Equal(0), out)
		Expect(out).To(ContainSubstring("CapBnd:\t0000000000000000"))
		Expect(out).To(ContainSubstring("CapEff:\t0000000000000000"))
		Expect(out).To(ContainSubstring("NoNewPrivs:\t1"))
		Expect(out).To(ContainSubstring("no-userns"))
		Expect(out).NotTo(ContainSubstring("USERNS-MADE"))

		By("each instance maps a host id range of its own")
		_, mapA := run(names[0], `cat /proc/self/uid_map`)
		_, mapB := run(names[1], `cat /proc/self/uid_map`)
		Expect(strings.Fields(mapA)[:3]).NotTo(Equal(strings.Fields(mapB)[:3]), "container root of both instances is the same host id:\n%s\n%s", mapA, mapB)

		By("root of one container plants a setuid binary in the shared source; the other's agent runs it as itself")
		cmd, cancel := testenv.Command(time.Minute, "incus", "exec", names[0], "--", "sh", "-c", "cp /bin/sh /workspace/shared/suid-sh && chmod 4755 /workspace/shared/suid-sh")
		defer cancel()
		plant, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(plant))
		fi, err := os.Stat(filepath.Join(shared, "suid-sh"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode() & os.ModeSetuid).NotTo(BeZero())
		// The other container does not see the file as its root's: its
		// owner is no id of that container (and no_new_privs above means
		// a setuid bit gains nothing there anyway).
		code, out = run(names[1], `stat -c %u /workspace/shared/suid-sh`)
		Expect(code).To(Equal(0), out)
		Expect(strings.TrimSpace(out)).To(Equal("65534"), "the file another container's root planted is owned by this container's root")
		Expect(agentID(sbs[1]).UID).NotTo(BeZero())
	})
})

var _ = Describe("Incus mount sources against the agent", func() {
	// The daemon binds disk devices by path when an instance starts. An
	// agent that replaces a component of a mount source's path (inside
	// another of its mounts) with a link once had the daemon bind what the
	// link named. The driver now resolves each source beneath its anchor
	// without links where the agent reaches it, and gives the daemon only
	// its own held binds.
	It("never binds what a link swapped into a mount source's path names", func() {
		ns := env.NewNamespace()
		host := filepath.Join(env.Dir, ns+"-host")
		team := filepath.Join(host, "team")
		src := filepath.Join(team, "a", "src")
		decoy := filepath.Join(host, "decoy")
		for _, d := range []string{src, filepath.Join(decoy, "src")} {
			Expect(os.MkdirAll(d, 0o755)).To(Succeed())
		}
		Expect(os.WriteFile(filepath.Join(src, "marker"), []byte("MOUNT\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(decoy, "src", "marker"), []byte("HOST\n"), 0o644)).To(Succeed())
		sb := newSandbox(ns, "swapped")
		sb.Spec.Binaries = append(sb.Spec.Binaries, "mv", "ln")
		sb.Spec.Mounts = []v1alpha1.Mount{
			{Source: team, Target: "team", Mode: v1alpha1.MountReadWrite},
			{Source: src, Target: "src", Mode: v1alpha1.MountReadWrite},
		}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(sb) })
		Expect(k8s.Create(ctx, newClaim(ns, "c1", "swapped"))).To(Succeed())
		Eventually(sandboxStatus(ns, "swapped"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)
		giveTo(sb, team)
		code, out := run(name, fmt.Sprintf(`mv /workspace/team/a /workspace/team/a.real && ln -s %s /workspace/team/a && cat /workspace/src/marker`, decoy))
		Expect(code).To(Equal(0), out)
		Expect(out).To(Equal("MOUNT\n"), "the running instance keeps the source it was started with")

		By("the next start binds nothing the link names, and says why")
		env.DeleteAndWait(newClaim(ns, "c1", "swapped"))
		Eventually(sandboxStatus(ns, "swapped"), timeout).Should(sandboxIs(0, metav1.ConditionFalse, v1alpha1.ReasonStopped))
		Expect(k8s.Create(ctx, newClaim(ns, "c2", "swapped"))).To(Succeed())
		Eventually(sandboxStatus(ns, "swapped"), timeout).Should(HaveField("Conditions", And(
			haveCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonMountSourceMissing),
			ContainElement(HaveField("Message", ContainSubstring("symbolic link"))))))
		Expect(inspect(name).Running).To(BeFalse())
		Expect(isMountPoint(filepath.Join(decoy, "src"))).To(BeFalse())

		By("put back by the host's owner, the instance starts with the source it was given")
		Expect(os.Remove(filepath.Join(team, "a"))).To(Succeed())
		Expect(os.Rename(filepath.Join(team, "a.real"), filepath.Join(team, "a"))).To(Succeed())
		nudge(sb)
		Eventually(sandboxStatus(ns, "swapped"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		_, out = run(name, `cat /workspace/src/marker`)
		Expect(out).To(Equal("MOUNT\n"))
	})
})

var _ = Describe("Incus resource limits", func() {
	It("bounds an instance's processes, memory and CPU by spec.resources", func() {
		ns := env.NewNamespace()
		sb := newSandbox(ns, "limited")
		sb.Spec.Binaries = append(sb.Spec.Binaries, "seq", "grep")
		sb.Spec.Resources = &v1alpha1.Resources{PidsLimit: ptr.To[int64](64),
			Limits: v1alpha1.ResourceAmounts{Memory: ptr.To(resource.MustParse("128Mi")), CPU: ptr.To(resource.MustParse("500m"))}}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(sb) })
		Expect(k8s.Create(ctx, newClaim(ns, "c", "limited"))).To(Succeed())
		Eventually(sandboxStatus(ns, "limited"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))
		name := instanceOf(sb)

		By("a fork bomb stops at the pids limit")
		// Each child counts itself. The exec that runs the bomb may fail
		// itself (the daemon cannot start its helper while the instance is
		// at its limit), so the count is read by the next one.
		_, _ = rt().Exec(ctx, name, runtimes.ExecRequest{Argv: []string{"sh", "-c",
			`rm -f /tmp/n; for i in $(seq 300); do (echo x >> /tmp/n; exec sleep 2) & done 2>/dev/null; wait`}})
		var out string
		Eventually(func() error {
			var b strings.Builder
			_, err := rt().Exec(ctx, name, runtimes.ExecRequest{Argv: []string{"grep", "-c", "x", "/tmp/n"}, Stdout: &b})
			out = b.String()
			return err
		}, timeout).Should(Succeed())
		n, err := strconv.Atoi(strings.TrimSpace(out))
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(n).To(And(BeNumerically(">", 0), BeNumerically("<", 64)), "the instance ran %d processes under a pids limit of 64", n)

		By("the kernel holds the memory and CPU limits (the instance's cgroups, read on the host)")
		limit := func(v1, v2 string) string {
			for _, p := range []string{v1, v2} {
				if b, err := os.ReadFile(p); err == nil {
					return strings.TrimSpace(string(b))
				}
			}
			return "unreadable: " + v1 + ", " + v2
		}
		payload := "lxc.payload." + name
		Expect(limit("/sys/fs/cgroup/memory/"+payload+"/memory.limit_in_bytes", "/sys/fs/cgroup/"+payload+"/memory.max")).To(Equal(strconv.Itoa(128 << 20)))
		if cgroup.SwapAccounted() {
			// No swap beyond the memory limit: on v1 a limit of memory and
			// swap together, on v2 one of swap alone.
			Expect(limit("/sys/fs/cgroup/memory/"+payload+"/memory.memsw.limit_in_bytes", "/sys/fs/cgroup/"+payload+"/memory.swap.max")).To(Or(Equal(strconv.Itoa(128<<20)), Equal("0")))
		}
		Expect(limit("/sys/fs/cgroup/cpu/"+payload+"/cpu.cfs_quota_us", "/sys/fs/cgroup/"+payload+"/cpu.max")).To(HavePrefix("50000"))
		Expect(limit("/sys/fs/cgroup/pids/"+payload+"/pids.max", "/sys/fs/cgroup/"+payload+"/pids.max")).To(Equal("64"))
	})
})

var _ = Describe("Incus profiles against the agent", func() {
	// A Sandbox names its profiles, and a profile an administrator made
	// for other work may carry a NIC, a host directory or privilege: the
	// instance took them all, so a Sandbox with egress None had a network
	// and a view of the host no class had checked.
	It("keeps the root disk of the profiles it names and masks every other device, and never runs privileged", func() {
		secretDir := filepath.Join(env.Dir, "profile-host-dir")
		Expect(os.MkdirAll(secretDir, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(secretDir, "secret"), []byte("TOPSECRET-profile"), 0o644)).To(Succeed())
		const profile = "sandbox-test-wide"
		cl := rawClient().InProject("")
		_, err := cl.Run(ctx, http.MethodPost, "/1.0/profiles", nil, map[string]any{
			"name":   profile,
			"config": map[string]string{"security.privileged": "true"},
			"devices": map[string]map[string]string{
				"root":    {"type": "disk", "path": "/", "pool": "default"},
				"eth9":    {"type": "nic", "nictype": "p2p"},
				"hostdir": {"type": "disk", "source": secretDir, "path": "/mnt/host"},
			},
		}, "")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			_, err := cl.Run(ctx, http.MethodDelete, "/1.0/profiles/"+profile, nil, nil, "")
			Expect(err).NotTo(HaveOccurred())
		})

		ns := env.NewNamespace()
		sb := newSandbox(ns, "wide")
		sb.Spec.Incus.Profiles = []string{profile}
		Expect(k8s.Create(ctx, sb)).To(Succeed())
		DeferCleanup(func() { env.DeleteAndWait(sb) })
		Expect(k8s.Create(ctx, newClaim(ns, "c", "wide"))).To(Succeed())
		Eventually(sandboxStatus(ns, "wide"), timeout).Should(sandboxIs(1, metav1.ConditionTrue, v1alpha1.ReasonRunning))

		name := instanceOf(sb)
		_, netdev := run(name, `cat /proc/net/dev`)
		var ifaces []string
		for _, line := range strings.Split(netdev, "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(line, "|") {
				ifaces = append(ifaces, strings.TrimSpace(name))
			}
		}
		Expect(ifaces).To(Equal([]string{"lo"}), "the profile's NIC is in the instance:\n%s", netdev)
		_, out := run(name, `cat /mnt/host/secret; cat /proc/self/uid_map`)
		Expect(out).NotTo(ContainSubstring("TOPSECRET"), "the profile's host directory is in the instance")
		Expect(out).NotTo(MatchRegexp(`(?m)^\s*0\s+0\s+4294967295`), "the instance runs privileged")
		inst, _, err := cl.GetInstance(ctx, name)
		Expect(err).NotTo(HaveOccurred())
		Expect(inst.ExpandedDevices["eth9"]).To(HaveKeyWithValue("type", "none"))
		Expect(inst.ExpandedDevices["hostdir"]).To(HaveKeyWithValue("type", "none"))
		Expect(inst.ExpandedDevices["root"]).To(HaveKeyWithValue("type", "disk"))
	})
})
