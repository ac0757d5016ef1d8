package boundedbuf_test

import (
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
)

func TestBufferKeepsTheFirstBytesAndCountsTheRest(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"nothing", nil, ""},
		{"within", []string{"ab", "cd"}, "abcd"},
		{"exactly full", []string{"abcdef"}, "abcdef"},
		{"over in one write", []string{"abcdefgh"}, "abcdef…(2 more bytes dropped)"},
		{"over across writes", []string{"abcd", "efgh", "ij"}, "abcdef…(4 more bytes dropped)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := boundedbuf.New(6)
			for _, w := range tt.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want all of it written", w, n, err)
				}
			}
			if got := b.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if b.Truncated() != strings.Contains(tt.want, "dropped") {
				t.Errorf("Truncated() = %v for %q", b.Truncated(), tt.want)
			}
		})
	}
}

func TestCutKeepsWholeCharacters(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 8, "short"},
		{"exactly8", 8, "exactly8"},
		{"longer than eight", 8, "longer t…"},
		{"ab€cd", 3, "ab…"}, // € is three bytes: never cut in two
		{"ab€cd", 5, "ab€…"},
	} {
		if got := boundedbuf.Cut(tc.in, tc.max); got != tc.want {
			t.Errorf("Cut(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}
