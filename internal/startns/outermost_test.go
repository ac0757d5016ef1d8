package startns

import (
	"slices"
	"testing"
)

func TestOutermost(t *testing.T) {
	got := outermost([]string{"/t/a/b-c", "/t/a/b/x", "/t/a/b", "/t/d", "/t/a/b"})
	want := []string{"/t/d", "/t/a/b", "/t/a/b-c"}
	if !slices.Equal(got, want) {
		t.Fatalf("outermost = %q, want %q", got, want)
	}
}
