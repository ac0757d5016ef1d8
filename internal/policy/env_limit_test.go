package policy

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// A 1 GiB sparse .env made the controller allocate about 2 GiB on every
// command; now it is refused with its own error and the read stops at the
// limit.
func TestReadDotEnvIsBounded(t *testing.T) {
	ws := t.TempDir()
	f, err := os.Create(filepath.Join(ws, DotEnvFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrDotEnvTooLarge) || !strings.Contains(err.Error(), "64 KiB") {
		t.Fatalf("want ErrDotEnvTooLarge naming the limit, got %v", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4*MaxDotEnvSize {
		t.Fatalf("reading a 1 GiB .env allocated %d bytes; the limit is %d", n, MaxDotEnvSize)
	}
}

func TestReadDotEnvAtTheLimit(t *testing.T) {
	ws := t.TempDir()
	line := "A=" + strings.Repeat("x", 97) + "\n"
	content := strings.Repeat(line, MaxDotEnvSize/len(line))
	if err := os.WriteFile(filepath.Join(ws, DotEnvFile), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{})
	if err != nil || len(b) != len(content) {
		t.Fatalf("a .env within the limit: %d bytes, %v", len(b), err)
	}
	if err := os.WriteFile(filepath.Join(ws, DotEnvFile), []byte(content+strings.Repeat("y", MaxDotEnvSize)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{}); !errors.Is(err, ErrDotEnvTooLarge) {
		t.Fatalf("a .env over the limit: %v", err)
	}
	if b, err := ReadDotEnv(areas.HostDir{Path: t.TempDir()}, areas.Identity{}); b != nil || err != nil {
		t.Fatalf("no .env: %q, %v", b, err)
	}
}
