// Package hostile_test applies a table of hostile manifests (sizes,
// characters, paths, refs, names, durations, quantities, cross-namespace
// references) to a real kube-apiserver with the real controller binary
// running, and checks that each is refused at admission with the message a
// user sees, or admitted and reported in a condition; then that the
// controller is idle: a bounded number of reconciles and little CPU time
// over a few seconds after the table.
package hostile_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/cluster"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

const (
	ns    = "hostile"
	other = "hostile-other"
	// conditionTimeout bounds how long an admitted object may take to
	// show its condition.
	conditionTimeout = 60 * time.Second
	// idleWindow is how long the controller is watched after the table.
	idleWindow = 5 * time.Second
	// maxIdleCPUTicks is 1s of CPU (USER_HZ 100) in the window: an idle
	// controller uses a few ticks, one spinning on an object a whole core.
	maxIdleCPUTicks = 100
)

// want is what a hostile object must meet: refused at admission with every
// one of refused in the error, or admitted and then showing condition
// condType with status False and reason on the object (msg in its message).
type want struct {
	refused  []string
	condType string
	reason   string
	msg      string
}

func refused(parts ...string) want { return want{refused: parts} }

func condition(typ, reason, msg string) want { return want{condType: typ, reason: reason, msg: msg} }

// obj is a raw object, so a test can send what the Go types cannot hold.
type obj = map[string]any

type entry struct {
	name string
	// kind is Sandbox or SessionClaim; namespace defaults to ns.
	kind, namespace string
	spec            obj
	meta            obj
	// strict asks for strict field validation, as kubectl apply does.
	strict bool
	// hold makes a claim on the Sandbox once it is admitted: an instance
	// nobody claims is not started, so nothing is checked.
	hold bool
	want want
}

var seq int

func (e entry) object() *unstructured.Unstructured {
	seq++
	m := obj{"name": fmt.Sprintf("h-%d", seq), "namespace": ns}
	if e.namespace != "" {
		m["namespace"] = e.namespace
	}
	for k, v := range e.meta {
		m[k] = v
	}
	return &unstructured.Unstructured{Object: obj{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": e.kind, "metadata": m, "spec": e.spec,
	}}
}

var agentSeq int

// sandbox is a Sandbox entry with an agent of its own, so that admitted
// entries do not meet in a NameConflict they were not written for.
func sandbox(name string, spec obj, w want) entry {
	agentSeq++
	s := obj{"agent": fmt.Sprintf("hostile-%d", agentSeq)}
	for k, v := range spec {
		s[k] = v
	}
	return entry{name: name, kind: "Sandbox", spec: s, want: w}
}

func sandboxMeta(name string, m obj, w want) entry {
	e := sandbox(name, nil, w)
	e.meta = m
	return e
}

func mounts(ms ...obj) obj {
	l := make([]any, len(ms))
	for i, m := range ms {
		l[i] = m
	}
	return obj{"mounts": l}
}

func mnt(src, target string) obj { return obj{"source": src, "target": target} }

func binaries(bs ...string) obj {
	l := make([]any, len(bs))
	for i, b := range bs {
		l[i] = b
	}
	return obj{"binaries": l}
}

func passthrough(vs ...string) obj {
	l := make([]any, len(vs))
	for i, v := range vs {
		l[i] = v
	}
	return obj{"env": obj{"passthrough": l}}
}

func containerdSpec(c obj) obj {
	s := obj{"image": "busybox"}
	for k, v := range c {
		s[k] = v
	}
	return obj{"backend": "containerd", "containerd": s}
}

func claim(name string, spec obj, w want) entry {
	s := obj{"sandboxName": "target"}
	for k, v := range spec {
		s[k] = v
	}
	return entry{name: name, kind: "SessionClaim", spec: s, want: w}
}

func worktree(w obj) obj {
	s := obj{"repository": "project"}
	for k, v := range w {
		s[k] = v
	}
	return obj{"worktree": s}
}

func many(n int, f func(i int) any) []any {
	l := make([]any, n)
	for i := range l {
		l[i] = f(i)
	}
	return l
}

// quantityRule is what the API server says of a string that is no
// resource.Quantity (every quantity field has the schema's pattern).
const quantityRule = "in body should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)"

func held(e entry) entry { e.hold = true; return e }

// Field paths and messages as kubectl prints them.
func invalid(field, msg string) []string { return []string{field + ": Invalid value", msg} }

func table(dir string) []entry {
	long := func(n int) string { return strings.Repeat("a", n) }
	missing := filepath.Join(dir, "does-not-exist")
	file := filepath.Join(dir, "a-file")
	loop := filepath.Join(dir, "loop")
	good := filepath.Join(dir, "good")
	return []entry{
		// Names and metadata: the API server's own rules.
		sandboxMeta("metadata.name with capitals", obj{"name": "Bad-Name"}, refused(`metadata.name: Invalid value: "Bad-Name"`, "a lowercase RFC 1123 subdomain")),
		sandboxMeta("metadata.name of 254 characters", obj{"name": long(254)}, refused("metadata.name: Invalid value", "must be no more than 253 characters")),
		sandboxMeta("metadata.name '..'", obj{"name": ".."}, refused(`metadata.name: Invalid value: ".."`, "a lowercase RFC 1123 subdomain")),
		sandboxMeta("metadata.name with '/'", obj{"name": "a/b"}, refused(`metadata.name: Invalid value: "a/b"`, "a lowercase RFC 1123 subdomain")),
		sandboxMeta("label value of 64 characters", obj{"labels": obj{"team": long(64)}}, refused("metadata.labels: Invalid value", "must be no more than 63 bytes")),
		sandboxMeta("label value with a NUL", obj{"labels": obj{"team": "a\x00b"}}, refused("metadata.labels: Invalid value", "a valid label must be an empty string or consist of alphanumeric characters")),
		sandboxMeta("annotations above 256 KiB", obj{"annotations": obj{"note": long(300 << 10)}}, refused("metadata.annotations: Too long", "may not be more than 262144 bytes")),
		sandboxMeta("object above the 3 MiB request limit", obj{"annotations": obj{"note": long(4 << 20)}}, refused("Request entity too large")),
		{name: "unknown spec field (kubectl apply is strict)", kind: "Sandbox", spec: obj{"agent": "strict", "shell": "/bin/sh"}, strict: true, want: refused(`unknown field "spec.shell"`)},

		// spec.agent.
		sandbox("agent missing", obj{"agent": nil}, refused("spec.agent: Required value")),
		sandbox("agent empty", obj{"agent": ""}, refused("spec.agent: Invalid value", "should be at least 1 chars long")),
		sandbox("agent of 53 characters", obj{"agent": long(53)}, refused("spec.agent: Too long", "may not be more than 52 bytes")),
		sandbox("agent with capitals", obj{"agent": "Alice"}, refused(invalid("spec.agent", v1alpha1.MsgAgentLabel)...)),
		sandbox("agent climbing with ..", obj{"agent": "alice/../bob"}, refused(invalid("spec.agent", v1alpha1.MsgAgentLabel)...)),
		sandbox("agent starting with '-'", obj{"agent": "-alice"}, refused(invalid("spec.agent", v1alpha1.MsgAgentLabel)...)),
		sandbox("agent with a NUL", obj{"agent": "ali\x00ce"}, refused(invalid("spec.agent", v1alpha1.MsgAgentLabel)...)),
		sandbox("agent with a right-to-left override", obj{"agent": "\u202ealice"}, refused(invalid("spec.agent", v1alpha1.MsgAgentLabel)...)),
		sandbox("agent with a zero-width space", obj{"agent": "al\u200bice"}, refused(invalid("spec.agent", v1alpha1.MsgAgentLabel)...)),
		sandbox("agent a number", obj{"agent": 42}, refused("spec.agent: Invalid value", "must be of type string")),

		// spec.backend and its tables.
		sandbox("backend unknown", obj{"backend": "docker"}, refused(`spec.backend: Unsupported value: "docker"`, `supported values: "bwrap", "containerd", "incus"`)),
		sandbox("backend containerd without its table", obj{"backend": "containerd"}, refused(v1alpha1.MsgContainerdRequired)),
		sandbox("backend incus without its table", obj{"backend": "incus"}, refused(v1alpha1.MsgIncusRequired)),
		sandbox("bwrap table with backend containerd", obj{"backend": "containerd", "containerd": obj{"image": "x"}, "bwrap": obj{"image": "y"}}, refused(v1alpha1.MsgBwrapOnly)),
		sandbox("bwrap image with a space", obj{"bwrap": obj{"image": "tools:1 --privileged"}}, refused(invalid("spec.bwrap.image", v1alpha1.MsgBwrapImage)...)),
		sandbox("bwrap image with a newline", obj{"bwrap": obj{"image": "tools:1\nx"}}, refused(invalid("spec.bwrap.image", v1alpha1.MsgBwrapImage)...)),
		sandbox("bwrap image pull secret that is no Secret's name", obj{"bwrap": obj{"image": "tools:1", "imagePullSecrets": []any{"../other-ns/regcred"}}}, refused("spec.bwrap.imagePullSecrets[0]: Invalid value", "should match")),
		sandbox("bwrap image pull policy of another name", obj{"bwrap": obj{"image": "tools:1", "imagePullPolicy": "Sometimes"}}, refused("spec.bwrap.imagePullPolicy: Unsupported value")),
		sandbox("containerd image empty", obj{"backend": "containerd", "containerd": obj{"image": ""}}, refused("spec.containerd.image: Invalid value", "should be at least 1 chars long")),

		// spec.mounts: sources.
		sandbox("mount source relative", mounts(mnt("projects/app", "app")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSource)...)),
		sandbox("mount source ~user/", mounts(mnt("~bob/app", "app")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSource)...)),
		sandbox("mount source ~/.. out of the home directory", mounts(mnt("~/../../etc", "etc")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSourceDots)...)),
		sandbox("mount source with a .. segment", mounts(mnt("/srv/app/../../etc", "etc")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSourceDots)...)),
		sandbox("mount source with a NUL", mounts(mnt("/srv/a\x00b", "app")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSourceChars)...)),
		sandbox("mount source with a right-to-left override", mounts(mnt("/srv/\u202eppa", "app")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSourceChars)...)),
		sandbox("mount source with a zero-width space", mounts(mnt("/srv/\u200bapp", "app")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSourceChars)...)),
		sandbox("mount source with a newline", mounts(mnt("/srv/a\nb", "app")), refused(invalid("spec.mounts[0].source", v1alpha1.MsgMountSourceChars)...)),
		sandbox("mount source of 4097 characters", mounts(mnt("/"+long(4096), "app")), refused("spec.mounts[0].source: Too long", "may not be more than 4096 bytes")),
		sandbox("mount source empty", mounts(mnt("", "app")), refused("spec.mounts[0].source: Invalid value", "should be at least 1 chars long")),
		sandbox("mount source missing", mounts(obj{"target": "app"}), refused("spec.mounts[0].source: Required value")),

		// spec.mounts: targets, modes, sizes, overlaps, counts.
		sandbox("mount target absolute", mounts(mnt("/srv/app", "/etc")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetAbs)...)),
		sandbox("mount target climbing with ..", mounts(mnt("/srv/app", "../../etc")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetDots)...)),
		sandbox("mount target with a . segment", mounts(mnt("/srv/app", "./app")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetDots)...)),
		sandbox("mount target with a doubled /", mounts(mnt("/srv/app", "a//b")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetEmpty)...)),
		sandbox("mount target with a trailing /", mounts(mnt("/srv/app", "app/")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetEmpty)...)),
		sandbox("mount target with a bidi isolate", mounts(mnt("/srv/app", "app\u2066")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetChars)...)),
		sandbox("mount target with a line separator", mounts(mnt("/srv/app", "a\u2028b")), refused(invalid("spec.mounts[0].target", v1alpha1.MsgMountTargetChars)...)),
		sandbox("mount target of 256 characters", mounts(mnt("/srv/app", long(256))), refused("spec.mounts[0].target: Too long", "may not be more than 255 bytes")),
		sandbox("mount target empty", mounts(mnt("/srv/app", "")), refused("spec.mounts[0].target: Invalid value", "should be at least 1 chars long")),
		sandbox("mount mode rwx", mounts(obj{"source": "/srv/app", "target": "app", "mode": "rwx"}), refused(invalid("spec.mounts[0].mode", v1alpha1.MsgMountMode)...)),
		sandbox("mount sizeLimit without overlay", mounts(obj{"source": "/srv/app", "target": "app", "mode": "rw", "sizeLimit": "1Gi"}), refused(v1alpha1.MsgMountSizeLimit)),
		sandbox("mount sizeLimit not a quantity", mounts(obj{"source": "/srv/app", "target": "app", "mode": "overlay", "sizeLimit": "lots"}), refused(`spec.mounts[0].sizeLimit: Invalid value: "lots"`, quantityRule)),
		sandbox("mount targets equal", mounts(mnt("/srv/a", "app"), mnt("/srv/b", "app")), refused(invalid("spec.mounts", v1alpha1.MsgMountOverlap)...)),
		sandbox("mount target nested below another", mounts(mnt("/srv/a", "app"), mnt("/srv/b", "app/data")), refused(invalid("spec.mounts", v1alpha1.MsgMountOverlap)...)),
		sandbox("65 mounts", obj{"mounts": many(65, func(i int) any { return mnt("/srv/a", fmt.Sprintf("m%d", i)) })}, refused("spec.mounts: Too many: 65: must have at most 64 items")),

		// spec.binaries.
		sandbox("binary with a space", binaries("git status"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinarySpace)...)),
		sandbox("binary with a tab", binaries("git\t"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinarySpace)...)),
		sandbox("binary a path", binaries("/usr/bin/git"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinarySlash)...)),
		sandbox("binary ../ a path up", binaries("../../bin/sh"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinarySlash)...)),
		sandbox("binary with ;", binaries("rm;reboot"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryMeta)...)),
		sandbox("binary with $()", binaries("$(id)"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryMeta)...)),
		sandbox("binary starting with '-'", binaries("-rf"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryPortable)...)),
		sandbox("binary starting with '.'", binaries(".hidden"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryPortable)...)),
		sandbox("binary with a NUL", binaries("git\x00"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryPortable)...)),
		sandbox("binary with a zero-width joiner", binaries("gi\u200dt"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryPortable)...)),
		sandbox("binary with a right-to-left override", binaries("\u202etig"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryPortable)...)),
		sandbox("binary with a letter outside ASCII", binaries("g\u00eft"), refused(invalid("spec.binaries[0]", v1alpha1.MsgBinaryPortable)...)),
		sandbox("binary twice", binaries("git", "git"), refused(`spec.binaries[1]: Duplicate value: "git"`)),
		sandbox("binary empty", binaries(""), refused("spec.binaries[0]: Invalid value", "should be at least 1 chars long")),
		sandbox("binary of 256 characters", binaries(long(256)), refused("spec.binaries[0]: Too long", "may not be more than 255 bytes")),
		sandbox("257 binaries", obj{"binaries": many(257, func(i int) any { return fmt.Sprintf("b%d", i) })}, refused("spec.binaries: Too many: 257: must have at most 256 items")),

		// spec.env.passthrough.
		sandbox("passthrough name starting with a digit", passthrough("1BAD"), refused(invalid("spec.env.passthrough[0]", v1alpha1.MsgEnvName)...)),
		sandbox("passthrough name with a value", passthrough("PATH=/evil"), refused(invalid("spec.env.passthrough[0]", v1alpha1.MsgEnvName)...)),
		sandbox("passthrough name twice", passthrough("HOME", "HOME"), refused(`spec.env.passthrough[1]: Duplicate value: "HOME"`)),
		sandbox("passthrough name of 256 characters", passthrough("A"+long(255)), refused("spec.env.passthrough[0]: Too long", "may not be more than 255 bytes")),

		// spec.idleTimeout: what Go would fail to decode or misread.
		sandbox("idleTimeout banana", obj{"idleTimeout": "banana"}, refused(invalid("spec.idleTimeout", v1alpha1.MsgIdleTimeoutFormat)...)),
		sandbox("idleTimeout negative", obj{"idleTimeout": "-5m"}, refused(invalid("spec.idleTimeout", v1alpha1.MsgIdleTimeoutFormat)...)),
		sandbox("idleTimeout overflowing int64", obj{"idleTimeout": "99999999999h"}, refused(invalid("spec.idleTimeout", v1alpha1.MsgIdleTimeoutFormat)...)),
		sandbox("idleTimeout zero", obj{"idleTimeout": "0s"}, refused(invalid("spec.idleTimeout", v1alpha1.MsgIdleTimeoutRange)...)),
		sandbox("idleTimeout above 30 days", obj{"idleTimeout": "721h"}, refused(invalid("spec.idleTimeout", v1alpha1.MsgIdleTimeoutRange)...)),
		sandbox("idleTimeout in words", obj{"idleTimeout": "5 minutes"}, refused(invalid("spec.idleTimeout", v1alpha1.MsgIdleTimeoutFormat)...)),
		sandbox("idleTimeout a number", obj{"idleTimeout": 300}, refused("spec.idleTimeout: Invalid value", "must be of type string")),

		// Quantities and bounded integers.
		sandbox("pidsLimit zero", containerdSpec(obj{"pidsLimit": 0}), refused(invalid("spec.containerd.pidsLimit", v1alpha1.MsgPidsLimit)...)),
		sandbox("pidsLimit above pid_max", containerdSpec(obj{"pidsLimit": v1alpha1.MaxPidsLimit + 1}), refused(invalid("spec.containerd.pidsLimit", v1alpha1.MsgPidsLimit)...)),
		sandbox("pidsLimit a string", containerdSpec(obj{"pidsLimit": "many"}), refused("spec.containerd.pidsLimit: Invalid value", "must be of type integer")),
		sandbox("memoryLimit zero", containerdSpec(obj{"memoryLimit": "0"}), refused(invalid("spec.containerd.memoryLimit", v1alpha1.MsgMemoryPositive)...)),
		sandbox("memoryLimit negative", containerdSpec(obj{"memoryLimit": "-1Gi"}), refused(invalid("spec.containerd.memoryLimit", v1alpha1.MsgMemoryPositive)...)),
		sandbox("memoryLimit not a quantity", containerdSpec(obj{"memoryLimit": "lots"}), refused(`spec.containerd.memoryLimit: Invalid value: "lots"`, quantityRule)),
		sandbox("rootfsSizeLimit negative", containerdSpec(obj{"rootfsSizeLimit": "-1"}), refused(invalid("spec.containerd.rootfsSizeLimit", v1alpha1.MsgRootfsPositive)...)),
		sandbox("incus rootSizeLimit zero", obj{"backend": "incus", "incus": obj{"image": "images:debian/12", "rootSizeLimit": "0Gi"}}, refused(invalid("spec.incus.rootSizeLimit", v1alpha1.MsgRootPositive)...)),
		sandbox("33 incus profiles", obj{"backend": "incus", "incus": obj{"image": "images:debian/12", "profiles": many(33, func(i int) any { return fmt.Sprintf("p%d", i) })}}, refused("spec.incus.profiles: Too many: 33: must have at most 32 items")),
		sandbox("restartPolicy unknown", obj{"restartPolicy": "Sometimes"}, refused(`spec.restartPolicy: Unsupported value: "Sometimes"`, `supported values: "WhenIdle", "Immediate"`)),
		sandbox("className of 254 characters", obj{"className": long(254)}, refused("spec.className: Too long", "may not be more than 253 bytes")),

		// SessionClaims.
		claim("sandboxName empty", obj{"sandboxName": ""}, refused("spec.sandboxName: Invalid value", "should be at least 1 chars long")),
		claim("sandboxName of 254 characters", obj{"sandboxName": long(254)}, refused("spec.sandboxName: Too long", "may not be more than 253 bytes")),
		claim("session of 1025 characters", obj{"session": long(1025)}, refused("spec.session: Too long", "may not be more than 1024 bytes")),
		claim("worktree repository absolute", worktree(obj{"repository": "/etc"}), refused(invalid("spec.worktree.repository", v1alpha1.MsgWorktreeRepository)...)),
		claim("worktree repository into another agent's areas", worktree(obj{"repository": "../../other-agent/workspace"}), refused(invalid("spec.worktree.repository", v1alpha1.MsgWorktreeRepository)...)),
		claim("worktree repository with a . segment", worktree(obj{"repository": "project/./x"}), refused(invalid("spec.worktree.repository", v1alpha1.MsgWorktreeRepository)...)),
		claim("worktree repository empty", worktree(obj{"repository": ""}), refused("spec.worktree.repository: Invalid value", "should be at least 1 chars long")),
		claim("worktree ref an option", worktree(obj{"ref": "--upload-pack=touch /tmp/x"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref -b", worktree(obj{"ref": "-b"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref with ..", worktree(obj{"ref": "main..evil"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref with a space", worktree(obj{"ref": "a b"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref a reflog @{", worktree(obj{"ref": "HEAD@{1}"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref ending in .lock", worktree(obj{"ref": "refs/heads/x.lock"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref with a NUL", worktree(obj{"ref": "main\x00"}), refused(invalid("spec.worktree.ref", v1alpha1.MsgWorktreeRef)...)),
		claim("worktree ref of 256 characters", worktree(obj{"ref": long(256)}), refused("spec.worktree.ref: Too long", "may not be more than 255 bytes")),
		claim("worktree name a path", worktree(obj{"name": "../x"}), refused(invalid("spec.worktree.name", v1alpha1.MsgWorktreeName)...)),
		claim("worktree name starting with '-'", worktree(obj{"name": "-x"}), refused(invalid("spec.worktree.name", v1alpha1.MsgWorktreeName)...)),
		claim("worktree name ending in .lock", worktree(obj{"name": "x.lock"}), refused(invalid("spec.worktree.name", v1alpha1.MsgWorktreeNameRef)...)),
		claim("worktree name of 64 characters", worktree(obj{"name": long(64)}), refused("spec.worktree.name: Too long", "may not be more than 63 bytes")),

		// Admitted: the controller reports them in a condition.
		held(sandbox("mount source that does not exist", mounts(mnt(missing, "data")), condition(v1alpha1.ConditionReady, v1alpha1.ReasonMountSourceMissing, "source "+missing+" does not exist"))),
		held(sandbox("mount source that is a file", mounts(mnt(file, "data")), condition(v1alpha1.ConditionReady, v1alpha1.ReasonMountSourceMissing, file))),
		held(sandbox("mount source that is a symbolic-link loop", mounts(mnt(loop, "data")), condition(v1alpha1.ConditionReady, v1alpha1.ReasonMountSourceMissing, loop))),
		sandbox("overlay sizeLimit zero", obj{"keepRunning": true, "mounts": []any{obj{"source": good, "target": "data", "mode": "overlay", "sizeLimit": "0"}}}, condition(v1alpha1.ConditionReady, v1alpha1.ReasonInvalidSpec, v1alpha1.MsgMountSizePositive)),
		sandbox("backend this controller does not run", containerdSpec(obj{}), condition(v1alpha1.ConditionReady, v1alpha1.ReasonBackendUnavailable, "containerd")),
		sandbox("bwrap image on a controller of one machine", obj{"keepRunning": true, "bwrap": obj{"image": "example.test/tools:1"}}, condition(v1alpha1.ConditionReady, v1alpha1.ReasonInvalidSpec, "spec.bwrap.image: a bwrap Sandbox runs over an image only on a cluster")),
		claim("claim naming a Sandbox of another namespace", obj{"sandboxName": "only-elsewhere"}, condition(v1alpha1.ConditionBound, v1alpha1.ReasonSandboxNotFound, "only-elsewhere")),
		claim("claim naming namespace/name", obj{"sandboxName": other + "/only-elsewhere"}, condition(v1alpha1.ConditionBound, v1alpha1.ReasonSandboxNotFound, "only-elsewhere")),
		claim("claim naming ../name", obj{"sandboxName": "../only-elsewhere"}, condition(v1alpha1.ConditionBound, v1alpha1.ReasonSandboxNotFound, "only-elsewhere")),
		{name: "agent of another namespace's Sandbox", kind: "Sandbox", namespace: other, spec: obj{"agent": "taken", "keepRunning": true}, want: condition(v1alpha1.ConditionReady, v1alpha1.ReasonNameConflict, "taken")},
		claim("worktree of a repository outside every mount", worktree(obj{"repository": "nowhere"}), condition(v1alpha1.ConditionWorktreeReady, v1alpha1.ReasonWorktreeFailed, "not inside any mount")),
		claim("worktree of a directory that is not a repository", worktree(obj{"repository": "project"}), condition(v1alpha1.ConditionWorktreeReady, v1alpha1.ReasonWorktreeFailed, "")),
	}
}

func TestHostileManifests(t *testing.T) {
	logf.SetLogger(logr.Discard())
	if p := testenv.AssetsProblem(); p != "" {
		testenv.Missing(t, "envtest binaries", p)
	}
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh)")
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sandbox-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	bin, err := cluster.BuildController(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := cluster.StartControlPlane(filepath.Join(root, "config", "crd", "bases"), dir)
	if err != nil {
		t.Fatal(err)
	}
	ctrl := &cluster.Controller{
		Bin: bin, LogPath: filepath.Join(dir, "controller.log"),
		Args: []string{"--areas-root", filepath.Join(dir, "areas"), "--state-dir", state, "--backends", "bwrap",
			"--health-probe-bind-address", "0", "--api-bind-address", "0"},
		Env: []string{"KUBECONFIG=" + cp.Kubeconfig},
	}
	t.Cleanup(func() {
		_ = ctrl.Stop()
		_ = cp.Stop()
		_ = bwrap.DetachTrees(filepath.Join(state, "bwrap"))
		if t.Failed() {
			t.Logf("kept %s (controller.log)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if err := ctrl.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k8s := cp.Client
	hostDirs(t, dir)
	for _, n := range []string{ns, other} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// What the admitted entries refer to: the Sandbox the claims name
	// (with a mount that is not a git repository), one that exists only
	// in the other namespace, and the older owner of agent "taken".
	for _, sb := range []*v1alpha1.Sandbox{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "target"}, Spec: v1alpha1.SandboxSpec{Agent: "target", KeepRunning: true,
			Mounts: []v1alpha1.Mount{{Source: filepath.Join(dir, "good"), Target: "project", Mode: v1alpha1.MountReadWrite}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "only-elsewhere"}, Spec: v1alpha1.SandboxSpec{Agent: "elsewhere"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "first-owner"}, Spec: v1alpha1.SandboxSpec{Agent: "taken", KeepRunning: true}},
	} {
		if err := k8s.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	// keepRunning keeps an instance running, it does not start one: a
	// claim does.
	for _, sb := range []string{"target", "first-owner"} {
		if err := k8s.Create(ctx, &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hold-" + sb},
			Spec: v1alpha1.SessionClaimSpec{SandboxName: sb}}); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, k8s, "Sandbox", ns, "target", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRunning, "")
	waitCondition(t, k8s, "Sandbox", ns, "first-owner", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonRunning, "")

	entries := table(dir)
	if len(entries) < 70 {
		t.Fatalf("the table has %d kinds of hostile objects, want at least 70", len(entries))
	}
	var admitted []*unstructured.Unstructured
	for _, e := range entries {
		t.Run(e.name, func(t *testing.T) {
			u := e.object()
			var opts []client.CreateOption
			if e.strict {
				opts = append(opts, client.FieldValidation(metav1.FieldValidationStrict))
			}
			err := k8s.Create(ctx, u, opts...)
			if e.want.refused != nil {
				if err == nil {
					admitted = append(admitted, u)
					t.Fatalf("admitted; want refused with %q", e.want.refused)
				}
				for _, part := range e.want.refused {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("refused with\n  %s\nwant it to say %q", err, part)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("refused (%v); want admitted and reported in %s", err, e.want.condType)
			}
			admitted = append(admitted, u)
			if e.hold {
				if err := k8s.Create(ctx, &v1alpha1.SessionClaim{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: "hold-" + u.GetName()},
					Spec: v1alpha1.SessionClaimSpec{SandboxName: u.GetName()}}); err != nil {
					t.Fatal(err)
				}
			}
			waitCondition(t, k8s, e.kind, u.GetNamespace(), u.GetName(), e.want.condType, metav1.ConditionFalse, e.want.reason, e.want.msg)
		})
	}
	t.Logf("%d kinds of hostile objects: %d refused at admission, %d admitted and reported", len(entries), len(entries)-len(admitted), len(admitted))

	// Idle: every admitted object has been looked at. What may still come
	// is a periodic look at each (MountSourceMissing every 10s, a running
	// instance every health interval), so in the window each object
	// accounts for at most one reconcile of itself and one of what it
	// points at, plus the three Sandboxes above.
	before, err := ctrl.Reconciles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cpu0, err := ctrl.CPUTicks()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(idleWindow)
	after, err := ctrl.Reconciles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cpu1, err := ctrl.CPUTicks()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for c, v := range after {
		n += v - before[c]
	}
	bound := 2*len(admitted) + 3
	t.Logf("in the %s after the table: %d reconciles (%v then %v), %d CPU ticks", idleWindow, n, before, after, cpu1-cpu0)
	if n > bound {
		t.Errorf("%d reconciles in the %s after the table, want at most %d: something keeps the controller busy (log %s)", n, idleWindow, bound, ctrl.LogPath)
	}
	if cpu1-cpu0 > maxIdleCPUTicks {
		t.Errorf("the controller used %d CPU ticks in the %s after the table, want at most %d", cpu1-cpu0, idleWindow, maxIdleCPUTicks)
	}
}

// hostDirs makes the mount sources the admitted entries name: a good
// directory, a file, a symbolic-link loop.
func hostDirs(t *testing.T, dir string) {
	if err := os.MkdirAll(filepath.Join(dir, "good"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a-file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("loop", filepath.Join(dir, "loop")); err != nil {
		t.Fatal(err)
	}
}

// waitCondition polls the object straight from the API server until its
// condition typ has that status and reason, with msg in its message.
func waitCondition(t *testing.T, k8s client.Client, kind, namespace, name, typ string, status metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	deadline := time.Now().Add(conditionTimeout)
	var last []metav1.Condition
	for time.Now().Before(deadline) {
		var conds []metav1.Condition
		key := client.ObjectKey{Namespace: namespace, Name: name}
		var err error
		switch kind {
		case "Sandbox":
			var o v1alpha1.Sandbox
			err = k8s.Get(context.Background(), key, &o)
			conds = o.Status.Conditions
		default:
			var o v1alpha1.SessionClaim
			err = k8s.Get(context.Background(), key, &o)
			conds = o.Status.Conditions
		}
		if err == nil {
			last = conds
			if c := meta.FindStatusCondition(conds, typ); c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, msg) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s %s/%s: want %s=%s reason %s with %q in its message within %s; conditions: %+v", kind, namespace, name, typ, status, reason, msg, conditionTimeout, last)
}
