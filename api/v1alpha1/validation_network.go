package v1alpha1

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/internal/pattern"
)

// The messages of spec.network's rules; the CEL markers in
// sandbox_types.go and sandboxclass_types.go carry them word for word.
const (
	MsgEgressHost      = "network.allow hosts are lowercase domain names of at least two labels, '*.' and such a name, or IP addresses"
	MsgEgressAllowOnly = "network.allow applies with egress Allowlist only"
	MsgEgressNoAllow   = "egress Allowlist needs at least one network.allow entry"
	// MsgEgressPort is the schema's item bounds, said in Go for
	// sandbox.toml.
	MsgEgressPort = "network.allow ports are between 1 and 65535"
)

// egressHostPattern is the form of a host name or wildcard in an egress
// rule: lowercase DNS labels, at least two, optionally after "*.".
var egressHostPattern = pattern.Lazy(`^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])+[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// CheckEgressHost says whether h is a host an egress rule may name: a
// name, a wildcard or an IP address without a zone.
func CheckEgressHost(h string) bool {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	return len(h) <= 253 && egressHostPattern().MatchString(h)
}

// validateNetwork applies spec.network's rules.
func validateNetwork(n *Network, p *field.Path) field.ErrorList {
	if n == nil {
		return nil
	}
	var errs field.ErrorList
	if n.Egress != "" && n.Egress != EgressNone && n.Egress != EgressAllowlist {
		errs = append(errs, field.NotSupported(p.Child("egress"), n.Egress, []string{string(EgressNone), string(EgressAllowlist)}))
	}
	allowlist := n.Egress == EgressAllowlist
	switch {
	case !allowlist && len(n.Allow) > 0:
		errs = append(errs, field.Invalid(p.Child("allow"), len(n.Allow), MsgEgressAllowOnly))
	case allowlist && len(n.Allow) == 0:
		errs = append(errs, field.Required(p.Child("allow"), MsgEgressNoAllow))
	case len(n.Allow) > 64:
		errs = append(errs, field.TooMany(p.Child("allow"), len(n.Allow), 64))
	}
	for i, r := range n.Allow {
		ip := p.Child("allow").Index(i)
		if !CheckEgressHost(r.Host) {
			errs = append(errs, field.Invalid(ip.Child("host"), r.Host, MsgEgressHost))
		}
		if len(r.Ports) > 16 {
			errs = append(errs, field.TooMany(ip.Child("ports"), len(r.Ports), 16))
		}
		for j, port := range r.Ports {
			if port < 1 || port > 65535 {
				errs = append(errs, field.Invalid(ip.Child("ports").Index(j), port, MsgEgressPort))
			}
		}
	}
	return errs
}
