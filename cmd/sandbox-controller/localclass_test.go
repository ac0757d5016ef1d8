package main

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// TestPermissiveClassIsTheSample keeps what `make run` installs and the
// default class of config/samples one class.
func TestPermissiveClassIsTheSample(t *testing.T) {
	b, err := os.ReadFile("../../config/samples/sandboxclass_default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sample v1alpha1.SandboxClass
	if err := yaml.UnmarshalStrict(b, &sample); err != nil {
		t.Fatal(err)
	}
	got := permissiveClass()
	if got.Name != sample.Name || !equality.Semantic.DeepEqual(got.Labels, sample.Labels) || !equality.Semantic.DeepEqual(got.Spec, sample.Spec) {
		t.Fatalf("make run installs %+v, config/samples has %+v", got, sample)
	}
}
