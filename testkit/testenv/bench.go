package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Every benchmark writes its figures the same way: `make bench-<name>`
// sets BenchOutEnv to docs/benchmarks-<name>.md, and the benchmark puts
// what it measured between that page's two markers for the target
// (WriteBenchTable). What a person wrote around the markers (what is
// measured, how to read it, comparisons with earlier runs) survives a new
// run. docs/benchmarks.md lists the pages.

// BenchOutEnv names the page a benchmark writes into. A benchmark whose
// run is opt-in (a Ginkgo spec, the scale test) exists only when it is set.
const BenchOutEnv = "SANDBOX_BENCH_OUT"

// BenchOut is the page to write into, or "" when no make target asked.
func BenchOut() string { return os.Getenv(BenchOutEnv) }

// BenchMarkers are the lines around target's figures in its page.
func BenchMarkers(target string) (begin, end string) {
	return "<!-- make " + target + ": begin -->\n", "<!-- make " + target + ": end -->\n"
}

// WriteBenchTable puts generated between target's markers in file. A file
// without the markers (or none at all) gets them, with generated between,
// at its end.
func WriteBenchTable(file, target, generated string) error {
	old, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	begin, end := BenchMarkers(target)
	if !strings.HasSuffix(generated, "\n") {
		generated += "\n"
	}
	block := begin + generated + end
	doc := string(old)
	before, rest, found := strings.Cut(doc, begin)
	if found {
		if _, after, ok := strings.Cut(rest, end); ok {
			return os.WriteFile(file, []byte(before+block+after), 0o644)
		}
		return fmt.Errorf("%s has the line %q but not %q after it; put it back before writing the figures", file, strings.TrimSpace(begin), strings.TrimSpace(end))
	}
	if doc != "" && !strings.HasSuffix(doc, "\n\n") {
		doc = strings.TrimRight(doc, "\n") + "\n\n"
	}
	return os.WriteFile(file, []byte(doc+block), 0o644)
}

// MachineNote describes the machine a benchmark ran on, without naming
// anything of its file system, and when.
func MachineNote() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = "Linux " + strings.TrimSpace(string(b))
	}
	bw := "bubblewrap"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "bwrap", "--version").Output(); err == nil {
		bw = string(bytes.TrimSpace(out))
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			load = ", load average " + f[0] + " at the end"
		}
	}
	return fmt.Sprintf("Measured %s on %s, %d cores visible, %s, %s, %s, running as uid %d%s; the cores were shared with other work, so p99 carries its noise.",
		time.Now().UTC().Format("2006-01-02"), cpu, runtime.NumCPU(), kernel, bw, runtime.Version(), os.Getuid(), load)
}
