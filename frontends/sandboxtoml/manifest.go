package sandboxtoml

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// manifest is a Sandbox without status: a converted file has nothing
// observed yet, and kubectl apply of a status is noise.
type manifest struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        manifestMeta         `json:"metadata"`
	Spec            v1alpha1.SandboxSpec `json:"spec"`
}

type manifestMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// Manifest renders spec as a Sandbox manifest for kubectl apply. name
// defaults to the agent; an empty namespace leaves it to kubectl.
func Manifest(spec *v1alpha1.SandboxSpec, name, namespace string) ([]byte, error) {
	if name == "" {
		name = spec.Agent
	}
	m := manifest{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Sandbox"},
		Metadata: manifestMeta{Name: name, Namespace: namespace},
		Spec:     *spec,
	}
	b, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("rendering the Sandbox manifest of agent %s: %w", spec.Agent, err)
	}
	return b, nil
}
