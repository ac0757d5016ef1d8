// Package admission holds the admission policy of config/admission that
// gives a new Sandbox the controller's finalizer, embedded for programs
// and test helpers that install it on an API server of their own.
package admission

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// files are the policy and its binding. Read in name order, the binding
// comes first, which the API server takes: a binding may name a policy
// not made yet.
//
//go:embed finalizer_policy.yaml finalizer_binding.yaml
var files embed.FS

// finalizerObjects returns the MutatingAdmissionPolicy that gives a new
// Sandbox the controller's finalizer, and its binding.
func finalizerObjects() ([]*unstructured.Unstructured, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, e := range entries {
		b, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name(), err)
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// InstallFinalizer creates the finalizer policy and its binding (leaving
// ones that exist) and waits until the API server applies them: the API
// server takes a new policy up a moment after it is stored. It probes with
// a dry-run create of a Sandbox in namespace, which stores nothing.
func InstallFinalizer(ctx context.Context, c client.Client, namespace string, timeout time.Duration) error {
	objs, err := finalizerObjects()
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("installing the finalizer policy: %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		probe := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "finalizer-policy-probe"},
			Spec: v1alpha1.SandboxSpec{Agent: "finalizer-policy-probe"}}
		err := c.Create(ctx, probe, client.DryRunAll)
		if err == nil && controllerutil.ContainsFinalizer(probe, v1alpha1.Finalizer) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("a new Sandbox still has no finalizer")
			}
			return fmt.Errorf("the finalizer policy is not applied after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
