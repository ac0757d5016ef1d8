package tenancy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

func sandbox(ns, name string, created int64, deleting bool) v1alpha1.Sandbox {
	sb := v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.Unix(created, 0)}}
	if deleting {
		now := metav1.Unix(created+100, 0)
		sb.DeletionTimestamp = &now
	}
	return sb
}

func TestOwner(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []v1alpha1.Sandbox
		want string
	}{
		{"none", nil, ""},
		{"the oldest owns", []v1alpha1.Sandbox{sandbox("b", "alice", 20, false), sandbox("a", "alice", 10, false)}, "a/alice"},
		{"a tie goes to the first namespace/name", []v1alpha1.Sandbox{sandbox("b", "alice", 10, false), sandbox("a", "zed", 10, false)}, "a/zed"},
		{"one being deleted owns nothing", []v1alpha1.Sandbox{sandbox("a", "alice", 10, true), sandbox("b", "alice", 20, false)}, "b/alice"},
		{"all being deleted", []v1alpha1.Sandbox{sandbox("a", "alice", 10, true)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if o := Owner(tc.in); o != nil {
				got = o.Namespace + "/" + o.Name
			}
			if got != tc.want {
				t.Fatalf("owner %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBind(t *testing.T) {
	root := t.TempDir()
	if err := Bind(root, "alice", "team-a"); err != nil {
		t.Fatalf("first bind: %v", err)
	}
	if err := Bind(root, "alice", "team-a"); err != nil {
		t.Fatalf("the same namespace again: %v", err)
	}
	err := Bind(root, "alice", "team-b")
	var conflict *ConflictError
	if !errors.As(err, &conflict) || conflict.Owner != "team-a" || conflict.Namespace != "team-b" {
		t.Fatalf("another namespace: got %v, want a ConflictError naming team-a", err)
	}
	for _, want := range []string{`agent "alice"`, `belong to namespace "team-a"`, `choose another agent name for this Sandbox in namespace "team-b"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), root) {
		t.Errorf("the conflict message names the host path: %q", err)
	}
	if err := Bind(root, "bob", "team-b"); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(root, RecordDir)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the record directory: %v %v, want mode 0700", fi, err)
	}
}

func TestBindRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plant  func(t *testing.T, dir string)
		agent  string
		ns     string
		wantIn string
	}{
		{"an agent that is no DNS label", nil, "../etc", "team-a", "agent must be a DNS-1123 label"},
		{"an empty namespace", nil, "alice", "", "is not a namespace name"},
		{"a namespace with a slash", nil, "alice", "a/b", "is not a namespace name"},
		{"a record that is a symbolic link", func(t *testing.T, dir string) {
			target := filepath.Join(t.TempDir(), "ns")
			if err := os.WriteFile(target, []byte("team-b\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(dir, "alice")); err != nil {
				t.Fatal(err)
			}
		}, "alice", "team-b", "reading the namespace record"},
		{"a damaged record", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "alice"), []byte(strings.Repeat("x", 4096)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "alice", "team-a", "is damaged"},
		{"an empty record", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "alice"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "alice", "team-a", "is damaged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, RecordDir)
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if tc.plant != nil {
				tc.plant(t, dir)
			}
			err := Bind(root, tc.agent, tc.ns)
			if err == nil || !strings.Contains(err.Error(), tc.wantIn) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantIn)
			}
		})
	}
}

// Two namespaces binding one agent at once: exactly one wins, every other
// bind is told which one, and the record is never half written.
func TestBindRace(t *testing.T) {
	for round := range 50 {
		root := t.TempDir()
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = Bind(root, "alice", fmt.Sprintf("team-%d", i))
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		b, err := os.ReadFile(filepath.Join(root, RecordDir, "alice"))
		if err != nil {
			t.Fatal(err)
		}
		owner := strings.TrimSuffix(string(b), "\n")
		for i, err := range errs {
			var conflict *ConflictError
			switch {
			case err == nil:
				winners++
				if fmt.Sprintf("team-%d", i) != owner {
					t.Fatalf("round %d: team-%d bound, but the record says %q", round, i, owner)
				}
			case errors.As(err, &conflict) && conflict.Owner == owner:
			default:
				t.Fatalf("round %d: team-%d: %v", round, i, err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d namespaces bound the agent, want 1", round, winners)
		}
		entries, _ := os.ReadDir(filepath.Join(root, RecordDir))
		if len(entries) != 1 {
			t.Fatalf("round %d: temporary records left: %v", round, entries)
		}
	}
}

// Bind remembers the records it read, but never past a change of the
// record: an administrator's handover (the record removed) and a record
// rewritten in place are both seen at the next Bind.
func TestBindSeesTheRecordChange(t *testing.T) {
	root := t.TempDir()
	if err := Bind(root, "alice", "team-a"); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(root, RecordDir, "alice")
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	if err := Bind(root, "alice", "team-b"); err != nil {
		t.Fatalf("after the record was removed (a handover): %v", err)
	}
	if err := Bind(root, "alice", "team-a"); err == nil {
		t.Fatal("team-a still binds after the areas went to team-b")
	}
	// In place, same length: only the change time tells.
	if err := os.WriteFile(record, []byte("team-c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var conflict *ConflictError
	if err := Bind(root, "alice", "team-b"); !errors.As(err, &conflict) || conflict.Owner != "team-c" {
		t.Fatalf("after the record was rewritten: got %v, want a conflict naming team-c", err)
	}
	if err := Bind(root, "alice", "team-c"); err != nil {
		t.Fatalf("the namespace the record names now: %v", err)
	}
}

// A record this process read is not read again while its file is the same:
// a Bind then costs one lstat, not the directory checks, an open and a read.
func TestBindReadsAKnownRecordOnce(t *testing.T) {
	root := t.TempDir()
	bind := func() {
		if err := Bind(root, "alice", "team-a"); err != nil {
			t.Fatal(err)
		}
	}
	bind()
	known := testing.AllocsPerRun(100, bind)
	unknown := testing.AllocsPerRun(100, func() {
		seenMu.Lock()
		delete(seen, recordKey{root, "alice"})
		seenMu.Unlock()
		bind()
	})
	if known*2 > unknown {
		t.Errorf("a Bind of a known record allocates %v, one that reads it %v: the known record is read again", known, unknown)
	}
}
