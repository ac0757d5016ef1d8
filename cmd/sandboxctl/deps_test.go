package main

import (
	"os/exec"
	"strings"
	"testing"
)

// A one-shot `sandboxctl run` starts every package sandboxctl links
// before it runs the command: the typed clientset (every API group's
// client and scheme) and kubectl's libraries took half of its time. The
// verbs that talk to a cluster use the dynamic client, client-go's
// kubeconfig loader and plain discovery requests instead.
func TestLinksNoHeavyKubernetesLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v: %s", err, out)
	}
	banned := []string{
		"k8s.io/client-go/kubernetes",               // the typed clientset, and its scheme of every group
		"k8s.io/client-go/discovery",                // links that scheme too
		"k8s.io/cli-runtime/",                       // kubectl's flags and resource builder
		"sigs.k8s.io/controller-runtime/pkg/client", // the controller's client and caches
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, b := range banned {
			if pkg == b || strings.HasPrefix(pkg, b+"/") || (strings.HasSuffix(b, "/") && strings.HasPrefix(pkg, b)) {
				t.Errorf("sandboxctl links %s (%s): every one-shot run would start it", pkg, b)
			}
		}
	}
}
