package testharness

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/gomega"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// twinGroup is the API group of the SessionClaim twin: the SessionClaim
// CRD as config/crd/bases has it, schema, validation rules and status
// subresource, under a group no controller watches.
const twinGroup = "twin.bench.cireilclaw.dev"

// twinGVK is the twin's kind.
var twinGVK = schema.GroupVersionKind{Group: twinGroup, Version: v1alpha1.GroupVersion.Version, Kind: "SessionClaim"}

// ClaimTwin answers each new SessionClaim twin in its namespace with one
// status write, as a controller with nothing to do but write a claim's
// status would: the least the API server needs for a claim on a running
// Sandbox (its create, its status write, and the two watch events), with
// the claim's own schema and status.
type ClaimTwin struct{ *answering }

// StartClaimTwin installs the twin CRD (once) and starts answering; each
// answer writes status, the status of a real claim, as it was stored.
func (e *Env) StartClaimTwin(status v1alpha1.SessionClaimStatus) *ClaimTwin {
	e.installTwin()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	Expect(err).NotTo(HaveOccurred())
	// The merge patch of a status write, as the controller's status
	// writer sends it.
	body, err := json.Marshal(map[string]any{"status": raw})
	Expect(err).NotTo(HaveOccurred())
	answer := client.RawPatch(types.MergePatchType, body)
	t := &ClaimTwin{e.startAnswering(newTwinList, "twin", func(ctx context.Context, o client.Object) error {
		return e.Client.Status().Patch(ctx, o, answer)
	})}
	// The first round trip of a new group pays for the clients' discovery
	// of it: not timed.
	t.Sample("warm-up", "none")
	return t
}

func newTwinList() client.ObjectList {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(twinGVK.GroupVersion().WithKind("SessionClaimList"))
	return list
}

// Sample creates a twin named name on Sandbox sandbox and returns the time
// until its answer is seen.
func (t *ClaimTwin) Sample(name, sandbox string) time.Duration {
	o := &unstructured.Unstructured{}
	o.SetGroupVersionKind(twinGVK)
	o.SetNamespace(t.ns)
	o.SetName(name)
	o.Object["spec"] = map[string]any{"sandboxName": sandbox, "session": name}
	return t.sample(o, twinReady)
}

// twinReady says whether the twin's status has been written: its Ready
// condition is there.
func twinReady(obj runtime.Object) bool {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return false
	}
	var st v1alpha1.SessionClaimStatus
	raw, _, _ := unstructured.NestedMap(u.Object, "status")
	if raw == nil || runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st) != nil {
		return false
	}
	return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady) != nil
}

// installTwin creates the twin CRD from the SessionClaim CRD's manifest
// and waits until it is served.
func (e *Env) installTwin() {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "config", "crd", "bases", v1alpha1.GroupVersion.Group+"_sessionclaims.yaml"))
	Expect(err).NotTo(HaveOccurred())
	crd := &apiextv1.CustomResourceDefinition{}
	Expect(yaml.UnmarshalStrict(data, crd)).To(Succeed())
	crd.Spec.Group = twinGroup
	crd.Name = crd.Spec.Names.Plural + "." + twinGroup
	// Its own names only: kubectl's short names and categories stay the
	// real SessionClaim's.
	crd.Spec.Names.ShortNames, crd.Spec.Names.Categories = nil, nil
	s := runtime.NewScheme()
	Expect(apiextv1.AddToScheme(s)).To(Succeed())
	c, err := client.New(e.Config, client.Options{Scheme: s})
	Expect(err).NotTo(HaveOccurred())
	if err := c.Create(context.Background(), crd); err != nil {
		Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	}
	Eventually(func() bool {
		got := &apiextv1.CustomResourceDefinition{}
		if c.Get(context.Background(), client.ObjectKeyFromObject(crd), got) != nil {
			return false
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
				return true
			}
		}
		return false
	}, Timeout).Should(BeTrue(), "the SessionClaim twin CRD was not established")
}
