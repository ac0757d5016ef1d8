package boundedbuf

import "unicode/utf8"

// Cut is s cut at most max bytes in, at the start of a character, with
// "…" after a cut: text a tenant or an agent wrote (a name, a path, a
// message) going into a message, a log line or an Event. A character cut
// in two would reach the API as U+FFFD, and the stored message would never
// equal the one derived again.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	for max > 0 && !utf8.RuneStart(s[max]) {
		max--
	}
	return s[:max] + "…"
}
