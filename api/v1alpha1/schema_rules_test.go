package v1alpha1_test

import (
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// decodeRuleMessages are the CEL messages of validation_input.go; the
// message test adds them to its set.
var decodeRuleMessages = []string{
	v1alpha1.MsgMountSourceDots, v1alpha1.MsgMountSourceChars, v1alpha1.MsgMountTargetChars,
	v1alpha1.MsgBinaryPortable, v1alpha1.MsgIdleTimeoutFormat, v1alpha1.MsgIdleTimeoutRange,
	v1alpha1.MsgPidsLimit, v1alpha1.MsgMemoryPositive, v1alpha1.MsgRootfsPositive, v1alpha1.MsgRootPositive,
}

// schemaNode is the part of an OpenAPI v3 schema the rules live in.
type schemaNode struct {
	Type        string                `json:"type"`
	Format      string                `json:"format"`
	Pattern     string                `json:"pattern"`
	Enum        []any                 `json:"enum"`
	Minimum     *float64              `json:"minimum"`
	Maximum     *float64              `json:"maximum"`
	Rules       []map[string]any      `json:"x-kubernetes-validations"`
	Properties  map[string]schemaNode `json:"properties"`
	Items       *schemaNode           `json:"items"`
	IntOrString bool                  `json:"x-kubernetes-int-or-string"`
}

type crdFile struct {
	Spec struct {
		Versions []struct {
			Name   string `json:"name"`
			Schema struct {
				OpenAPIV3Schema schemaNode `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

func loadSchema(t *testing.T, file string) schemaNode {
	t.Helper()
	b, err := os.ReadFile("../../config/crd/bases/" + file)
	if err != nil {
		t.Fatalf("reading the generated CRD: %v", err)
	}
	var crd crdFile
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatalf("parsing %s: %v", file, err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == v1alpha1.GroupVersion.Version {
			return v.Schema.OpenAPIV3Schema
		}
	}
	t.Fatalf("%s has no version %s", file, v1alpha1.GroupVersion.Version)
	return schemaNode{}
}

var (
	durationType = reflect.TypeFor[metav1.Duration]()
	quantityType = reflect.TypeFor[resource.Quantity]()
	timeType     = reflect.TypeFor[metav1.Time]()
	// The API server checks the object meta types itself.
	skipped = map[reflect.Type]bool{
		reflect.TypeFor[metav1.TypeMeta]():   true,
		reflect.TypeFor[metav1.ObjectMeta](): true,
		reflect.TypeFor[metav1.ListMeta]():   true,
	}
)

// unruledFields walks a Go type beside its schema and returns the fields
// the API server would store although Go cannot decode them, or would
// decode them into something the type does not mean: a duration, quantity
// or time without a format, pattern or rule; a string enum without its
// values; an integer without bounds (narrower than int64: bounds inside the
// type).
func unruledFields(t reflect.Type, s schemaNode, path string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if skipped[t] {
		return nil
	}
	hasRule := len(s.Rules) > 0
	switch {
	case t == durationType:
		if !hasRule && s.Pattern == "" {
			return []string{path + " (metav1.Duration): no pattern or CEL rule, yet Go refuses any string time.ParseDuration refuses"}
		}
		return nil
	case t == quantityType:
		if !hasRule && s.Pattern == "" {
			return []string{path + " (resource.Quantity): no pattern or CEL rule, yet Go refuses any string that is not a quantity"}
		}
		return nil
	case t == timeType:
		if s.Format != "date-time" {
			return []string{path + " (metav1.Time): no date-time format"}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.String:
		if t.PkgPath() != "" && len(s.Enum) == 0 && !hasRule && s.Pattern == "" {
			return []string{fmt.Sprintf("%s (%s): a typed string without enum, pattern or CEL rule", path, t)}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if hasRule {
			return nil
		}
		lo, hi := intRange(t)
		if s.Minimum == nil || *s.Minimum < lo || (t.Bits() < 64 && (s.Maximum == nil || *s.Maximum > hi)) {
			return []string{fmt.Sprintf("%s (%s): integer without a minimum%s", path, t, map[bool]string{true: " and a maximum inside the type", false: ""}[t.Bits() < 64])}
		}
	case reflect.Float32, reflect.Float64:
		return []string{path + ": floats are not part of this API"}
	case reflect.Slice:
		if s.Items == nil {
			return []string{path + ": list without an items schema"}
		}
		return unruledFields(t.Elem(), *s.Items, path+"[]")
	case reflect.Struct:
		var out []string
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
				out = append(out, unruledFields(f.Type, s, path)...)
				continue
			}
			if skipped[f.Type] {
				continue
			}
			child, ok := s.Properties[name]
			if !ok {
				out = append(out, fmt.Sprintf("%s.%s: in the Go type but not in the schema", path, name))
				continue
			}
			out = append(out, unruledFields(f.Type, child, path+"."+name)...)
		}
		return out
	}
	return nil
}

func intRange(t reflect.Type) (float64, float64) {
	bits := t.Bits()
	switch t.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return 0, math.Pow(2, float64(bits)) - 1
	}
	return -math.Pow(2, float64(bits-1)), math.Pow(2, float64(bits-1)) - 1
}

// TestEveryDecodedFieldHasAnAdmissionRule fails when a field can be
// admitted by the API server but not decoded by the controller: one such
// object once made the whole Sandbox list undecodable.
func TestEveryDecodedFieldHasAnAdmissionRule(t *testing.T) {
	for _, c := range []struct {
		file string
		typ  reflect.Type
	}{
		{"sandbox.cireilclaw.dev_sandboxes.yaml", reflect.TypeFor[v1alpha1.Sandbox]()},
		{"sandbox.cireilclaw.dev_sessionclaims.yaml", reflect.TypeFor[v1alpha1.SessionClaim]()},
	} {
		t.Run(c.typ.Name(), func(t *testing.T) {
			if bad := unruledFields(c.typ, loadSchema(t, c.file), c.typ.Name()); len(bad) > 0 {
				t.Fatalf("fields the API server admits without a rule Go needs:\n%s", strings.Join(bad, "\n"))
			}
		})
	}
}

// TestSchemaWalkFindsAFieldWithoutItsRule shows the walk is not vacuous:
// the schema of the issue (idleTimeout a bare string, pidsLimit unbounded,
// claims without bounds, backend without its enum) is caught field by field.
func TestSchemaWalkFindsAFieldWithoutItsRule(t *testing.T) {
	s := loadSchema(t, "sandbox.cireilclaw.dev_sandboxes.yaml")
	spec := s.Properties["spec"]
	strip := func(parent map[string]schemaNode, name string) {
		n := parent[name]
		n.Rules, n.Pattern, n.Enum, n.Minimum, n.Maximum = nil, "", nil, nil, nil
		parent[name] = n
	}
	strip(spec.Properties, "idleTimeout")
	strip(spec.Properties, "backend")
	strip(spec.Properties["containerd"].Properties, "pidsLimit")
	strip(spec.Properties["containerd"].Properties, "memoryLimit")
	strip(s.Properties["status"].Properties, "claims")
	got := strings.Join(unruledFields(reflect.TypeFor[v1alpha1.Sandbox](), s, "Sandbox"), "\n")
	for _, want := range []string{
		"Sandbox.spec.idleTimeout (metav1.Duration)",
		"Sandbox.spec.backend (v1alpha1.Backend)",
		"Sandbox.spec.containerd.pidsLimit (int64)",
		"Sandbox.spec.containerd.memoryLimit (resource.Quantity)",
		"Sandbox.status.claims (int32)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the walk did not report %s; it reported:\n%s", want, got)
		}
	}
}
