package v1alpha1

// The exec and file API's names, which its server (frontends/execapi) and
// its clients (sandboxctl, clients/go) share. They live here, with the
// rest of the API, so a client needs no server code: importing the
// server's package made every sandboxctl start pay for the API server's
// libraries (tens of milliseconds of package initialisation).
const (
	// SubresourceGroup is the API group of the aggregated API.
	SubresourceGroup = "subresources.sandbox.cireilclaw.dev"
	// SubresourceVersion is its only version.
	SubresourceVersion = "v1alpha1"
	// SubresourcePrefix is the path prefix of the group's version.
	SubresourcePrefix = "/apis/" + SubresourceGroup + "/" + SubresourceVersion
	// ExecAudience is the audience a bearer token for a node's exec API
	// must be issued for.
	ExecAudience = "sandbox.cireilclaw.dev/exec"
)

// Where clients find the exec API's CA: a ConfigMap of the controllers'
// namespace (theirs unless told otherwise), its certificate under a key.
const (
	DefaultSystemNamespace = "sandbox-controller-system"
	ExecCAConfigMap        = "sandbox-controller-ca"
	ExecCAConfigMapKey     = "ca.crt"
)
