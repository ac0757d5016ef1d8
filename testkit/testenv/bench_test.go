package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteBenchTableKeepsWhatAPersonWrote(t *testing.T) {
	file := filepath.Join(t.TempDir(), "benchmarks-x.md")
	if err := WriteBenchTable(file, "bench-x", "| a |\n"); err != nil {
		t.Fatal(err)
	}
	begin, end := BenchMarkers("bench-x")
	if got, _ := os.ReadFile(file); string(got) != begin+"| a |\n"+end {
		t.Fatalf("a new page: %q", got)
	}
	page := "# X\n\nwhat is measured\n\n" + begin + "| old |\n" + end + "\nread it so\n"
	if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteBenchTable(file, "bench-x", "| new |"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(file)
	if want := strings.Replace(page, "| old |", "| new |", 1); string(got) != want {
		t.Errorf("rewritten page:\n%s\nwant:\n%s", got, want)
	}
	// Another target's block is added, the first one left alone.
	if err := WriteBenchTable(file, "bench-y", "| y |"); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(file)
	if !strings.Contains(string(got), "| new |") || !strings.HasSuffix(string(got), "\n\n<!-- make bench-y: begin -->\n| y |\n<!-- make bench-y: end -->\n") {
		t.Errorf("page after a second target:\n%s", got)
	}
	// A page whose end marker was lost is refused, not overwritten.
	if err := os.WriteFile(file, []byte("# X\n"+begin+"| old |\nhand-written\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteBenchTable(file, "bench-x", "| new |"); err == nil || !strings.Contains(err.Error(), "bench-x: end") {
		t.Errorf("a page without its end marker: %v", err)
	}
	if got, _ := os.ReadFile(file); !strings.Contains(string(got), "hand-written") {
		t.Error("the page without its end marker was changed")
	}
}
