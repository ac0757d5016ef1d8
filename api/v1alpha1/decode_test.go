package v1alpha1_test

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// listWithOneUndecodable is what the API server serves when a CRD without
// its rules let idleTimeout: banana in beside a good Sandbox.
const listWithOneUndecodable = `{"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"SandboxList","metadata":{},"items":[
 {"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"bad","namespace":"a"},
  "spec":{"agent":"bad","idleTimeout":"banana","keepRunning":true,"containerd":{"image":"x","memoryLimit":"lots"}},
  "status":{"claims":3000000000,"instance":"cireilclaw-bad"}},
 {"apiVersion":"sandbox.cireilclaw.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"good","namespace":"b"},
  "spec":{"agent":"good","idleTimeout":"90s"},"status":{"claims":1}}]}`

func decodeList(t *testing.T, data string) *v1alpha1.SandboxList {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// The deserializer client-go's typed clients and informers use.
	obj, _, err := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode([]byte(data), nil, nil)
	if err != nil {
		t.Fatalf("one undecodable Sandbox failed the whole list: %v", err)
	}
	return obj.(*v1alpha1.SandboxList)
}

func TestListWithAnUndecodableSandboxStillDecodes(t *testing.T) {
	list := decodeList(t, listWithOneUndecodable)
	if len(list.Items) != 2 {
		t.Fatalf("want both Sandboxes, got %d", len(list.Items))
	}
	bad, good := list.Items[0], list.Items[1]

	if bad.Spec.Agent != "bad" || !bad.Spec.KeepRunning || bad.Spec.IdleTimeout != nil || bad.Spec.Containerd != nil {
		t.Errorf("the fields that decode are kept and the others left out; got %+v", bad.Spec)
	}
	if bad.Status.Instance != "cireilclaw-bad" || bad.Status.Claims != 0 {
		t.Errorf("status keeps what decodes and drops the rest; got %+v", bad.Status)
	}
	got := v1alpha1.ValidateSandboxSpec(&bad.Spec).ToAggregate().Error()
	for _, want := range []string{
		`spec.idleTimeout: Invalid value: "banana": ` + v1alpha1.MsgIdleTimeoutFormat,
		`spec.containerd: Invalid value: "{\"image\":\"x\",\"memoryLimit\":\"lots\"}": the controller cannot decode this value`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("validation of the undecodable spec lacks %q; got %s", want, got)
		}
	}
	// The cache hands out copies; the record must survive them.
	if errs := v1alpha1.ValidateSandboxSpec(&bad.DeepCopy().Spec); len(errs) != 2 {
		t.Errorf("a deep copy lost the undecoded fields: %v", errs)
	}

	if good.Spec.IdleTimeout == nil || good.Spec.IdleTimeout.Duration.String() != "1m30s" || good.Status.Claims != 1 {
		t.Errorf("the good Sandbox decodes as usual; got %+v", good)
	}
	if errs := v1alpha1.ValidateSandboxSpec(&good.Spec); len(errs) != 0 {
		t.Errorf("the good Sandbox is valid; got %v", errs)
	}
}

// An update the controller sends (adding its finalizer) carries the user's
// values back as written: it never turns banana into the default 5m.
func TestUndecodableFieldsAreWrittenBackAsRead(t *testing.T) {
	bad := decodeList(t, listWithOneUndecodable).Items[0]
	bad.Finalizers = append(bad.Finalizers, v1alpha1.Finalizer)
	out, err := json.Marshal(&bad)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Spec map[string]json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if string(back.Spec["idleTimeout"]) != `"banana"` || string(back.Spec["containerd"]) != `{"image":"x","memoryLimit":"lots"}` {
		t.Errorf("the undecoded values were not written back as read: %s", out)
	}
	if string(back.Spec["agent"]) != `"bad"` {
		t.Errorf("the decoded fields are written as usual: %s", out)
	}
}

func TestObjectThatIsNotJSONStillFails(t *testing.T) {
	var spec v1alpha1.SandboxSpec
	if err := json.Unmarshal([]byte(`"not an object"`), &spec); err == nil {
		t.Fatal("a spec that is not an object decoded")
	}
}
