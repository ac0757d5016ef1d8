// Package commandname is the rule for the name of a command: what admission
// checks in a Sandbox's binaries (api/v1alpha1) and what the exec policy
// checks in the command of every request (internal/policy), with the
// messages both give. It imports nothing of the project, so the API and the
// drivers' policy share it without the drivers seeing the API.
package commandname

import "strings"

// Messages of the rule; the API's admission messages are these.
const (
	MsgSpace = "binaries must not contain spaces; arguments are passed separately"
	MsgMeta  = "binaries must not contain shell metacharacters; arguments are passed separately"
	MsgSlash = "binaries are command names, not paths: they must not contain '/'"
)

// ShellMetacharacters are the characters a command name must not contain:
// each means something to a shell.
const ShellMetacharacters = "|&;<>()$`\\\"'*?[]{}#~!"

// Check returns the message of the rule name breaks, or "".
func Check(name string) string {
	if _, ok := FirstForbidden(name); ok {
		if strings.ContainsAny(name, " \t\n\r\v\f") {
			return MsgSpace
		}
		return MsgMeta
	}
	if strings.Contains(name, "/") {
		return MsgSlash
	}
	return ""
}

// FirstForbidden returns the first whitespace or shell metacharacter in s.
func FirstForbidden(s string) (rune, bool) {
	for _, r := range s {
		if r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f' || strings.ContainsRune(ShellMetacharacters, r) {
			return r, true
		}
	}
	return 0, false
}
