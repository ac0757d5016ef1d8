package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:                      "/plain",
		`/repo\040with\040space/.git`: "/repo with space/.git",
		`/tab\011and\012newline`:      "/tab\tand\nnewline",
		`/back\134slash`:              `/back\slash`,
		`/not\08octal`:                `/not\08octal`,
		`/short\04`:                   `/short\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
