package main

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
)

// permissiveClass allows everything a Sandbox can ask for, every
// registered backend included: on a single-user machine the user is the
// administrator, and the product behaves as it does without classes. config/samples/sandboxclass_default.yaml
// is the same class.
func permissiveClass() *v1alpha1.SandboxClass {
	return &v1alpha1.SandboxClass{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{v1alpha1.DefaultClassLabel: "true"}},
		Spec: v1alpha1.SandboxClassSpec{
			AllowedBackends:         backend.Names(),
			AllowedMountSourceRoots: []string{"/"},
			AllowedEnv:              []string{"*"},
			Devices:                 v1alpha1.ClassDevices{USB: true, All: true},
			AllowedImages:           v1alpha1.ClassImages{Bwrap: []string{"*"}, Containerd: []string{"*"}, Incus: []string{"*"}},
			AllowedEgress:           []string{"*"},
			AllowedIncusProfiles:    []string{"*"},
			Scheduling:              v1alpha1.ClassScheduling{AllowedPriorityClassNames: []string{"*"}, AllowedTolerations: []string{"*"}, PodAffinity: true, NodeName: true},
		},
	}
}

// installPermissiveClass creates the permissive default class in the local
// control plane, keeping one that is already there.
func installPermissiveClass(ctx context.Context, cfg *rest.Config) error {
	scheme, err := v1alpha1.SchemeBuilder.Build()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("installing the default SandboxClass: %w", err)
	}
	if err := c.Create(ctx, permissiveClass()); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("installing the default SandboxClass: %w", err)
	}
	return nil
}
