// Package policy decides whether a command may run in a sandbox and builds
// the environment it runs with: the binaries allowlist, the argv checks, the
// environment rebuilt from nothing, and the insecure switch that disables
// the sandbox. Every driver calls it before running anything.
//
// It must never run a command itself, never consult a shell, and never let
// a variable of the runtime's own environment through unless the sandbox
// configuration names it.
package policy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cireilclaw/sandbox-controller/internal/commandname"
)

// ErrRefused is wrapped by every refusal, so callers can tell a refused
// command from a failure to run an allowed one.
var ErrRefused = errors.New("command refused")

// CheckArgv checks a command against the allowlist: argv[0] is the command,
// a bare name that must be listed in allowed and must contain no shell
// metacharacter, space or slash. Arguments are passed as they are.
func CheckArgv(allowed []string, argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return fmt.Errorf("%w: no command given", ErrRefused)
	}
	cmd := argv[0]
	if r, ok := commandname.FirstForbidden(cmd); ok {
		what := "shell metacharacter"
		if isSpace(r) {
			what = "whitespace"
		}
		return fmt.Errorf("%w: command %q contains the %s %q; pass arguments separately, never as one string", ErrRefused, cmd, what, r)
	}
	if msg := commandname.Check(cmd); msg != "" {
		return fmt.Errorf("%w: command %q: %s", ErrRefused, cmd, msg)
	}
	if !slices.Contains(allowed, cmd) {
		return fmt.Errorf("%w: command %q is not in the sandbox's binaries allowlist %v", ErrRefused, cmd, allowed)
	}
	return nil
}

func isSpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f'
}
