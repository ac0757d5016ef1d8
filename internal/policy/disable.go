package policy

import (
	"fmt"
	"slices"
)

// DisableSandboxEnv is the variable of the runtime's environment that
// disables the sandbox. Only the exact values in disableValues do.
const DisableSandboxEnv = "CIREILCLAW_RUNTIME_INSECURE_DISABLE_SANDBOX_I_AM_100_PERCENT_SURE"

// disableValues are the values that disable the sandbox: the documented one
// and the two the seed keeps for source parity. They are compared exactly:
// a case or whitespace variant is a mistake, and a mistake keeps the
// sandbox.
var disableValues = []string{
	"i-am-in-a-container",
	"babe-i-brought-protection",
	"we-are-literally-transbians-what",
}

// SandboxDisabled reports whether the runtime's environment disables the
// sandbox, and the variable's value (set but ignored values included, so a
// caller can say why a near miss changed nothing).
func SandboxDisabled(getenv func(string) string) (value string, disabled bool) {
	value = getenv(DisableSandboxEnv)
	return value, slices.Contains(disableValues, value)
}

// DisabledWarning is what is printed before each command that runs without
// the sandbox: it runs as the runtime's own user and group, uid and gid,
// not as the agent's.
func DisabledWarning(value string, uid, gid int) string {
	return fmt.Sprintf("WARNING: THE SANDBOX IS DISABLED (%s=%s): this command runs directly on the host with the runtime's privileges (uid %d, gid %d; not the agent's own id); nothing but the allowlist stands between it and the host. Unset the variable to restore the sandbox.\n", DisableSandboxEnv, value, uid, gid)
}
