// Package execapi is the HTTPS API agent platforms use to run commands and
// move files in a SessionClaim's sandbox from wherever they run.
//
// It secures requests the way the kubelet secures pods/exec: the caller is
// authenticated by the API server (TokenReview for bearer tokens) or by a
// client certificate signed by the configured client CA, and every request
// is authorised with a SubjectAccessReview on the claim (create
// sessionclaims/exec, get or update sessionclaims/files). Exec speaks the
// Kubernetes remote-command websocket protocol (v5.channel.k8s.io), so
// client-go's websocket executor works unchanged.
//
// This package must never run a command the policy refuses, never answer an
// unauthenticated or unauthorised request with anything but 401 or 403,
// never touch an agent's files except through internal/areas, and never
// hold a command's output or a file it streams in memory as a whole.
package execapi
