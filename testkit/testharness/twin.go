package testharness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
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
type ClaimTwin struct {
	e      *Env
	ns     string
	stop   context.CancelFunc
	failed chan error
	// status is the status each answer writes.
	status map[string]any
}

// StartClaimTwin installs the twin CRD (once) and starts answering; each
// answer writes status, the status of a real claim, as it was stored.
func (e *Env) StartClaimTwin(status v1alpha1.SessionClaimStatus) *ClaimTwin {
	e.installTwin()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	t := &ClaimTwin{e: e, ns: e.NewNamespace(), stop: cancel, failed: make(chan error, 1), status: raw}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(twinGVK.GroupVersion().WithKind("SessionClaimList"))
	w, err := e.watchClient().Watch(ctx, list, client.InNamespace(t.ns))
	Expect(err).NotTo(HaveOccurred())
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type != watch.Added {
				continue
			}
			if err := e.Client.Status().Patch(ctx, o, twinAnswer(t.status)); err != nil && ctx.Err() == nil {
				t.fail(fmt.Errorf("answering twin %s: %w", o.GetName(), err))
			}
		}
		if ctx.Err() == nil {
			t.fail(fmt.Errorf("the answering watch on namespace %s ended", t.ns))
		}
	}()
	// The first round trip of a new group pays for the clients' discovery
	// of it: not timed.
	t.Sample("warm-up", "none")
	return t
}

// twinAnswer is the merge patch of a status write, as the controller's
// status writer sends it.
func twinAnswer(status map[string]any) client.Patch {
	body, err := json.Marshal(map[string]any{"status": status})
	Expect(err).NotTo(HaveOccurred())
	return client.RawPatch(types.MergePatchType, body)
}

func (t *ClaimTwin) fail(err error) {
	select {
	case t.failed <- err:
	default:
	}
}

// Sample creates a twin named name on Sandbox sandbox and returns the time
// until its answer is seen.
func (t *ClaimTwin) Sample(name, sandbox string) time.Duration {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(twinGVK.GroupVersion().WithKind("SessionClaimList"))
	w, err := t.e.watchClient().Watch(context.Background(), list, client.InNamespace(t.ns), client.MatchingFields{"metadata.name": name})
	Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	o := &unstructured.Unstructured{}
	o.SetGroupVersionKind(twinGVK)
	o.SetNamespace(t.ns)
	o.SetName(name)
	o.Object["spec"] = map[string]any{"sandboxName": sandbox, "session": name}
	start := time.Now()
	Expect(t.e.Client.Create(context.Background(), o)).To(Succeed())
	timeout := time.After(Timeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			Expect(ok).To(BeTrue(), "the watch of twin %s ended before its answer", name)
			if u, isU := ev.Object.(*unstructured.Unstructured); isU && twinReady(u) {
				return time.Since(start)
			}
		case err := <-t.failed:
			Fail(err.Error())
		case <-timeout:
			Fail(fmt.Sprintf("twin %s was not answered within %s", name, Timeout))
		}
	}
}

// twinReady says whether the twin's status has been written: its Ready
// condition is there.
func twinReady(u *unstructured.Unstructured) bool {
	var st v1alpha1.SessionClaimStatus
	raw, _, _ := unstructured.NestedMap(u.Object, "status")
	if raw == nil || runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st) != nil {
		return false
	}
	return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady) != nil
}

// Stop stops answering.
func (t *ClaimTwin) Stop() { t.stop() }

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
