package backend

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// ImageAllowed reports whether allowed (images, or prefixes ending in '*')
// holds image: the rule of a class's allowedImages for every backend that
// runs an image. For an OCI reference (ociRef: bwrap's and containerd's)
// a '*' after a tag's ':' stands for a tag (and a digest after it), never
// for more of a path: "ubuntu:*" holds "ubuntu:24.04", not
// "ubuntu:5000/team-b/tools", which names the registry ubuntu:5000. An
// Incus image ("images:debian/12") is a remote and an alias, '/' and all.
func ImageAllowed(image string, allowed []string, ociRef bool) bool {
	for _, a := range allowed {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(image, p) && (!ociRef || !inTag(p) || !strings.Contains(image[len(p):], "/")) {
				return true
			}
		} else if image == a {
			return true
		}
	}
	return false
}

// inTag says whether the end of the reference prefix p is in a tag: its
// last path component holds a ':'.
func inTag(p string) bool {
	return strings.Contains(p[strings.LastIndexByte(p, '/')+1:], ":")
}

// ClassLimit checks *q, the value of field in a spec, against the maximum
// of class (get reads it from the class's ClassLimits) and fills in the
// default (else the maximum) where the Sandbox sets none.
func ClassLimit(class, field string, q **resource.Quantity, def, max *v1alpha1.ClassLimits, get func(*v1alpha1.ClassLimits) *resource.Quantity) []string {
	var d, m *resource.Quantity
	if def != nil {
		d = get(def)
	}
	if max != nil {
		m = get(max)
	}
	switch {
	case *q != nil && m != nil && (*q).Cmp(*m) > 0:
		return []string{fmt.Sprintf("%s: %s is above the maximum %s of SandboxClass %q", field, (*q).String(), m.String(), class)}
	case *q == nil && d != nil:
		c := d.DeepCopy()
		*q = &c
	case *q == nil && m != nil:
		c := m.DeepCopy()
		*q = &c
	}
	return nil
}

// Size is q as the drivers take a size: in bytes, and as written (for
// messages and the ConfigHash's encoding).
func Size(q *resource.Quantity) *runtimes.Size {
	if q == nil {
		return nil
	}
	return &runtimes.Size{Bytes: q.Value(), Text: q.String()}
}
