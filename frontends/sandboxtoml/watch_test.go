package sandboxtoml

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// replace writes content the way editors that save atomically do: a new
// file renamed over the old one.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".swp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type reports struct {
	mu      sync.Mutex
	errs    []error
	reloads []int64
}

func (r *reports) onError(err error) { r.mu.Lock(); r.errs = append(r.errs, err); r.mu.Unlock() }
func (r *reports) onReload(s Snapshot) {
	r.mu.Lock()
	r.reloads = append(r.reloads, s.Generation)
	r.mu.Unlock()
}
func (r *reports) errCount() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.errs) }
func (r *reports) lastErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) == 0 {
		return nil
	}
	return r.errs[len(r.errs)-1]
}

func binariesOf(w *Watcher) string {
	var names []string
	for _, b := range w.Current().Spec.Binaries {
		names = append(names, string(b))
	}
	return strings.Join(names, ",")
}

func TestWatcherReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sandbox.toml")
	writeFile(t, path, "[bwrap]\nbinaries = [\"git\"]\n")
	rep := &reports{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := Watch(ctx, path, "ada", WatchOptions{Settle: 20 * time.Millisecond, OnError: rep.onError, OnReload: rep.onReload})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := binariesOf(w); got != "git" || w.Current().Generation != 1 {
		t.Fatalf("initial configuration %q generation %d", got, w.Current().Generation)
	}

	t.Run("reload/in-place write", func(t *testing.T) {
		writeFile(t, path, "[bwrap]\nbinaries = [\"git\", \"python3\"]\n")
		testenv.Eventually(t, 5*time.Second, "the in-place edit is not applied", func() bool { return binariesOf(w) == "git,python3" })
	})
	t.Run("reload/rename over the file", func(t *testing.T) {
		replace(t, path, "[bwrap]\nbinaries = [\"make\"]\n")
		testenv.Eventually(t, 5*time.Second, "the renamed-over file is not applied", func() bool { return binariesOf(w) == "make" })
	})
	t.Run("reload/invalid edit keeps the last good configuration and reports", func(t *testing.T) {
		gen := w.Current().Generation
		before := rep.errCount()
		replace(t, path, "[bwrap]\nbinaries = [\"make\", \"rm -rf\"]\nbogus = 1\n")
		testenv.Eventually(t, 5*time.Second, "the invalid edit is not reported", func() bool { return rep.errCount() > before })
		if got := binariesOf(w); got != "make" || w.Current().Generation != gen {
			t.Fatalf("after an invalid edit the configuration is %q generation %d, want the last good one (make, %d)", got, w.Current().Generation, gen)
		}
		msg := rep.lastErr().Error()
		for _, want := range []string{"sandbox.toml:3:1: bwrap.bogus: unknown key", "keeping the last good configuration"} {
			if !strings.Contains(msg, want) {
				t.Fatalf("reported %q, want it to say %q", msg, want)
			}
		}
		replace(t, path, "[bwrap]\nbinaries = [\"make\"]\n[devices]\nusb = true\n")
		testenv.Eventually(t, 5*time.Second, "the fixed file is not applied", func() bool { return w.Current().Spec.Devices.USB })
	})
	t.Run("reload/an unchanged rewrite is not a new generation", func(t *testing.T) {
		gen := w.Current().Generation
		before := rep.errCount()
		writeFile(t, path, "[bwrap]\nbinaries = [\"make\"]\n[devices]\nusb = true\n")
		writeFile(t, path+".other", "unrelated")
		replace(t, path, "[bwrap]\nbinaries = [\"cargo\"]\n")
		testenv.Eventually(t, 5*time.Second, "the last edit is not applied", func() bool { return binariesOf(w) == "cargo" })
		if g := w.Current().Generation; g != gen+1 || rep.errCount() != before {
			t.Fatalf("generation %d after one real change from %d (%d errors)", g, gen, rep.errCount()-before)
		}
	})
	t.Run("reload/removing the file is the default, still sandboxed", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, "the removal is not applied", func() bool { return binariesOf(w) == "" })
		if b := w.Current().Spec.BackendOrDefault(); b != v1alpha1.BackendBwrap {
			t.Fatalf("backend after removal %s", b)
		}
	})
}

func TestWatchRefusesAnInvalidFirstLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandbox.toml")
	writeFile(t, path, "backend = \"docker\"\n")
	if _, err := Watch(context.Background(), path, "ada", WatchOptions{}); err == nil || !strings.Contains(err.Error(), "sandbox.toml:1:1: backend") {
		t.Fatalf("Watch with an invalid file: %v", err)
	}
}

// TestReloadUnderRunningCommands runs commands in a loop through a real
// bubblewrap sandbox while the file flips between two valid configurations
// and invalid ones. Every command must see one whole configuration: the
// passthrough pair of A or of B, never a mix and never an invalid one.
func TestReloadUnderRunningCommands(t *testing.T) {
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh); in CI a missing bwrap fails this test")
	dir := t.TempDir()
	path := filepath.Join(dir, "sandbox.toml")
	configA := "[bwrap]\nbinaries = [\"env\"]\n[env]\npassthrough = [\"A1\", \"A2\"]\n"
	configB := "[bwrap]\nbinaries = [\"env\"]\n[env]\npassthrough = [\"B1\", \"B2\"]\n"
	invalid := []string{
		"[bwrap]\nbinaries = [\"env\"]\n[env]\npassthrough = [\"A1\", \"B1\"]\nunknown = true\n",
		"[bwrap]\nbinaries = [\"env\", \"env;\"]\n[env]\npassthrough = [\"A2\", \"B2\"]\n",
		"[bwrap]\nbinaries = [\"env\"]\n[env]\npassthrough = [\"A1\", \"B2\"",
	}
	writeFile(t, path, configA)
	rep := &reports{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := Watch(ctx, path, "ada", WatchOptions{Settle: 20 * time.Millisecond, OnError: rep.onError})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	env := map[string]string{"A1": "a1", "A2": "a2", "B1": "b1", "B2": "b2"}
	rt, err := bwrap.New(bwrap.Config{
		StateDir:  filepath.Join(dir, "state"),
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	})
	if err != nil {
		t.Fatal(err)
	}
	// Before the directory goes: its trees are mounts on the host.
	t.Cleanup(func() {
		if err := bwrap.DetachTrees(filepath.Join(dir, "state")); err != nil {
			t.Error(err)
		}
	})
	runner := NewRunner(w, rt, v1alpha1.BackendBwrap, instance.Host{AreasRoot: filepath.Join(dir, "areas")})

	var writes atomic.Int64
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			content := configA
			switch i % 5 {
			case 1:
				content = configB
			case 2, 4:
				content = invalid[i%len(invalid)]
			}
			tmp := fmt.Sprintf("%s.%d", path, i)
			if i%2 == 0 {
				_ = os.WriteFile(path, []byte(content), 0o644)
			} else if os.WriteFile(tmp, []byte(content), 0o644) == nil {
				_ = os.Rename(tmp, path)
			}
			writes.Add(1)
			// Longer than the settle time, so that every write is read;
			// the reads race with the commands, not with the writes.
			time.Sleep(30 * time.Millisecond)
		}
	}()

	seen := map[string]int{}
	for i := 0; i < 150; i++ {
		var out, stderr bytes.Buffer
		st, err := runner.Exec(context.Background(), runtimes.ExecRequest{Argv: []string{"env"}, Stdout: &out, Stderr: &stderr})
		if err != nil || st.Code != 0 {
			t.Fatalf("command %d: %v, exit %d, stderr %q", i, err, st.Code, stderr.String())
		}
		var got []string
		for _, kv := range strings.Split(out.String(), "\n") {
			if k, _, ok := strings.Cut(kv, "="); ok && env[k] != "" {
				got = append(got, k)
			}
		}
		set := strings.Join(got, ",")
		if set != "A1,A2" && set != "B1,B2" {
			t.Fatalf("command %d ran with passthrough %q: neither configuration A nor B", i, set)
		}
		seen[set]++
	}
	close(stop)
	<-writerDone
	if seen["A1,A2"] == 0 || seen["B1,B2"] == 0 {
		t.Fatalf("over %d writes the commands saw %v: the reloads did not reach them", writes.Load(), seen)
	}
	if rep.errCount() == 0 {
		t.Fatalf("no invalid edit was reported over %d writes", writes.Load())
	}

	replace(t, path, configB)
	testenv.Eventually(t, 5*time.Second, "the final configuration B does not reach the next command", func() bool {
		var out bytes.Buffer
		_, err := runner.Exec(context.Background(), runtimes.ExecRequest{Argv: []string{"env"}, Stdout: &out})
		return err == nil && strings.Contains(out.String(), "B1=b1") && !strings.Contains(out.String(), "A1=")
	})
	t.Logf("commands saw %v over %d writes; %d invalid edits reported", seen, writes.Load(), rep.errCount())
}
