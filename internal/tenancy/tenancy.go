// Package tenancy keeps namespaces from sharing an agent. An agent's
// instance belongs to one Sandbox at a time (Owner: the oldest in the
// cluster), and its areas on a node belong for good to the namespace that
// first used them (Bind), so that a Sandbox of the same agent in another
// namespace never reaches them, not even after the first one is deleted
// (areas are never deleted). The controllers and the exec API ask the same
// questions; this package never moves or deletes an area.
package tenancy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

// RecordDir is the directory in the areas root that records which
// namespace each agent's areas belong to, one file per agent holding the
// namespace. Its name cannot be an agent's (agents are DNS labels), and
// agents never see the areas root.
const RecordDir = ".namespaces"

// maxRecord bounds what is read of a record: a namespace and a newline.
const maxRecord = 256

// Owner returns the Sandbox of sandboxes (those naming one agent) that owns
// the agent: the oldest that is not being deleted, by creation time, then
// namespace/name. It returns nil when every one is being deleted.
func Owner(sandboxes []v1alpha1.Sandbox) *v1alpha1.Sandbox {
	var owner *v1alpha1.Sandbox
	for i := range sandboxes {
		sb := &sandboxes[i]
		if !sb.DeletionTimestamp.IsZero() {
			continue
		}
		if owner == nil || Older(sb, owner) {
			owner = sb
		}
	}
	return owner
}

// Older reports whether a was created before b (ties broken by
// namespace/name, so every controller picks the same one).
func Older(a, b *v1alpha1.Sandbox) bool {
	ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// ConflictError says that an agent's areas belong to another namespace.
type ConflictError struct {
	Agent, Namespace, Owner string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("the areas of agent %q on this node belong to namespace %q, and agents are never shared between namespaces: "+
		"choose another agent name for this Sandbox in namespace %q (an administrator can hand the areas over; see docs/exec-api.md)",
		e.Agent, e.Owner, e.Namespace)
}

// Bind records that agent's areas under root belong to namespace, unless
// they already belong to one: then it returns a *ConflictError when that
// is another namespace. Areas laid out before records existed belong to
// the first namespace bound to them.
func Bind(root, agent, namespace string) error {
	if msg := v1alpha1.CheckAgent(agent); msg != "" {
		return fmt.Errorf("binding the areas of agent %q: %s", agent, msg)
	}
	if namespace == "" || strings.ContainsAny(namespace, "/\n\x00") {
		return fmt.Errorf("binding the areas of agent %q: namespace %q is not a namespace name", agent, namespace)
	}
	owner, ok := remembered(root, agent)
	if !ok {
		dir, err := recordDir(root)
		if err != nil {
			return err
		}
		path := filepath.Join(dir, agent)
		owner, err = read(root, agent, path)
		if errors.Is(err, fs.ErrNotExist) {
			if err := record(dir, path, agent, namespace); err != nil {
				return err
			}
			owner, err = read(root, agent, path)
		}
		if err != nil {
			return err
		}
	}
	if owner != namespace {
		return &ConflictError{Agent: agent, Namespace: namespace, Owner: owner}
	}
	return nil
}

// Every reconcile of a Sandbox and of its claims, and every exec and file
// request, asks Bind; a record, once written, changes only when an
// administrator removes it to hand the areas over. So this process
// remembers each record it read with the file's identity, and a record
// whose file is still that one (same device, inode, size and change time,
// one lstat) is not read again; any other is.

// recordKey names one record: the areas root and the agent.
type recordKey struct{ root, agent string }

// recordSeen is a record as read, and its file's identity then.
type recordSeen struct {
	namespace string
	dev, ino  uint64
	size      int64
	ctime     unix.Timespec
}

var (
	seenMu sync.Mutex
	seen   = map[recordKey]recordSeen{}
)

// remembered returns the namespace of the record of agent under root when
// this process read it and its file has not changed since.
func remembered(root, agent string) (string, bool) {
	seenMu.Lock()
	r, ok := seen[recordKey{root, agent}]
	seenMu.Unlock()
	if !ok {
		return "", false
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, RecordDir, agent), &st); err != nil || !sameFile(r, &st) {
		return "", false
	}
	return r.namespace, true
}

func sameFile(r recordSeen, st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Dev == r.dev && st.Ino == r.ino && st.Size == r.size && st.Ctim == r.ctime
}

// record writes namespace to path unless path exists. The record is
// written aside and linked in: link fails when the name exists, so of two
// binds at once one wins and the other reads the winner's record whole.
func record(dir, path, agent, namespace string) error {
	tmp, err := os.CreateTemp(dir, "."+agent+"-*")
	if err != nil {
		return fmt.Errorf("recording the namespace of agent %q: %w", agent, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(namespace + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("recording the namespace of agent %q: %w", agent, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("recording the namespace of agent %q: %w", agent, err)
	}
	return nil
}

// recordDir returns root/RecordDir, creating it (and root) when missing.
func recordDir(root string) (string, error) {
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("areas root %q must be an absolute path", root)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("creating the areas root %s: %w", root, err)
	}
	dir := filepath.Join(root, RecordDir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("creating the agent namespace records %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("reading the agent namespace records %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("the agent namespace records %s are not a directory (%s); refusing to use them", dir, fi.Mode().Type())
	}
	return dir, nil
}

// read returns the namespace a record holds, never following a link, and
// remembers it with the identity of the file it was read from.
func read(root, agent, path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("reading the namespace record %s: %w", path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", fmt.Errorf("reading the namespace record %s: %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil {
		return "", fmt.Errorf("reading the namespace record %s: %w", path, err)
	}
	ns := strings.TrimSuffix(string(b), "\n")
	if len(b) > maxRecord || ns == "" || strings.ContainsAny(ns, "/\n\x00") {
		return "", fmt.Errorf("the namespace record %s is damaged; an administrator must repair it (it holds the namespace the agent's areas belong to)", path)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		seenMu.Lock()
		seen[recordKey{root, agent}] = recordSeen{namespace: ns, dev: st.Dev, ino: st.Ino, size: st.Size, ctime: st.Ctim}
		seenMu.Unlock()
	}
	return ns, nil
}
