package main

import (
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/overlay"
)

// A name the agent chose must not be able to pass for another line of the
// listing a reviewer reads.
func TestChangeLineQuotesNames(t *testing.T) {
	cases := []struct {
		name, path, want string
	}{
		{"plain name", "src/main.go", " src/main.go"},
		{"newline", "a\nD important.txt", ` "a\nD important.txt"`},
		{"carriage return", "a\rM b", ` "a\rM b"`},
		{"space", "a b", ` "a b"`},
		{"escape sequence", "a\x1b[2Kb", ` "a\x1b[2Kb"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := changeLine(overlay.Change{Path: c.path, Kind: overlay.Changed, Type: areas.TypeFile, Mode: 0o644, SHA256: "00"})
			if !strings.HasSuffix(got, c.want) || strings.ContainsAny(got, "\n\r\x1b") {
				t.Fatalf("got %q, want it to end in %q on one line", got, c.want)
			}
		})
	}
}
