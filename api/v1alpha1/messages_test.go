package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// TestCRDMessagesMatchGoRules keeps the CEL messages in the generated CRDs
// and the Go rule messages one set, so kubectl and sandbox.toml users read
// the same words.
func TestCRDMessagesMatchGoRules(t *testing.T) {
	goMsgs := map[string]bool{
		v1alpha1.MsgMountSource: true, v1alpha1.MsgMountTargetAbs: true, v1alpha1.MsgMountTargetDots: true,
		v1alpha1.MsgMountTargetEmpty: true, v1alpha1.MsgMountMode: true, v1alpha1.MsgMountOverlap: true, v1alpha1.MsgMountSizeLimit: true,
		v1alpha1.MsgBinarySpace: true, v1alpha1.MsgBinaryMeta: true, v1alpha1.MsgBinarySlash: true,
		v1alpha1.MsgEnvName: true, v1alpha1.MsgAgentLabel: true, v1alpha1.MsgAgentImmutable: true,
		v1alpha1.MsgBackendImmutable: true, v1alpha1.MsgIncusRequired: true, v1alpha1.MsgContainerdRequired: true,
		v1alpha1.MsgSandboxNameImmut: true, v1alpha1.MsgWorktreeImmutable: true, v1alpha1.MsgWorktreeRepository: true,
		v1alpha1.MsgWorktreeName: true, v1alpha1.MsgWorktreeNameRef: true, v1alpha1.MsgWorktreeRef: true,
		v1alpha1.MsgClassRoot: true, v1alpha1.MsgClassEnv: true, v1alpha1.MsgClassAgentIDs: true, v1alpha1.MsgClassMemoryMax: true,
		v1alpha1.MsgClassPidsMax: true, v1alpha1.MsgClassRootfsMax: true, v1alpha1.MsgClassRootMax: true,
		v1alpha1.MsgEgressHost: true, v1alpha1.MsgEgressAllowOnly: true, v1alpha1.MsgEgressNoAllow: true,
		v1alpha1.MsgClassEgress: true, v1alpha1.MsgClassEgressNet: true,
		v1alpha1.MsgBwrapOnly: true, v1alpha1.MsgBwrapImage: true,
	}
	for _, m := range decodeRuleMessages {
		goMsgs[m] = true
	}
	// MsgMountSizePositive is a Go rule only: a CEL rule on a quantity
	// cannot bound the string it parses, and the API server refuses its
	// estimated cost. The controller refuses such a spec (InvalidSpec) and
	// so does the sandbox.toml loader.
	files, err := filepath.Glob("../../config/crd/bases/*.yaml")
	if err != nil || len(files) != 3 {
		t.Fatalf("expected the three generated CRDs in config/crd/bases, found %v (%v)", files, err)
	}
	msgLine := regexp.MustCompile(`(?m)^\s*- message: (.*(?:\n\s{6,}[^-\s:][^:]*$)*)`)
	space := regexp.MustCompile(`\s+`)
	crdMsgs := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgLine.FindAllStringSubmatch(string(b), -1) {
			msg := space.ReplaceAllString(m[1], " ")
			if len(msg) > 1 && (msg[0] == '\'' || msg[0] == '"') {
				msg = msg[1 : len(msg)-1]
				msg = regexp.MustCompile(`''`).ReplaceAllString(msg, "'")
			}
			crdMsgs[msg] = true
		}
	}
	var onlyCRD, onlyGo []string
	for m := range crdMsgs {
		if !goMsgs[m] {
			onlyCRD = append(onlyCRD, m)
		}
	}
	for m := range goMsgs {
		if !crdMsgs[m] {
			onlyGo = append(onlyGo, m)
		}
	}
	sort.Strings(onlyCRD)
	sort.Strings(onlyGo)
	if len(onlyCRD) > 0 || len(onlyGo) > 0 {
		t.Fatalf("CEL and Go rule messages differ:\nonly in the CRDs: %q\nonly in Go: %q", onlyCRD, onlyGo)
	}
}
