//go:build linux

package areas

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// IDRange is a block of host user and group ids handed to agents, one id
// (the same number as uid and gid) per agent.
type IDRange struct {
	First uint32
	Count uint32
}

// DefaultIDRange sits above the ranges distributions hand to users in
// /etc/subuid (100000 and up, 65536 each) and below 2^31, where some tools
// misbehave.
var DefaultIDRange = IDRange{First: 2000000000, Count: 65536}

// String is the range in the form ParseIDRange reads.
func (r IDRange) String() string { return fmt.Sprintf("%d:%d", r.First, r.Count) }

// Contains reports whether id is in the range.
func (r IDRange) Contains(id uint32) bool {
	return id >= r.First && uint64(id) < uint64(r.First)+uint64(r.Count)
}

// ParseIDRange reads FIRST:COUNT. The range may not include 0: agents never
// run as host root.
func ParseIDRange(s string) (IDRange, error) {
	first, count, ok := strings.Cut(s, ":")
	if !ok {
		return IDRange{}, fmt.Errorf("agent id range %q: want FIRST:COUNT, e.g. %s", s, DefaultIDRange)
	}
	f, err := strconv.ParseUint(first, 10, 32)
	if err != nil {
		return IDRange{}, fmt.Errorf("agent id range %q: first id: %w", s, err)
	}
	c, err := strconv.ParseUint(count, 10, 32)
	if err != nil {
		return IDRange{}, fmt.Errorf("agent id range %q: count: %w", s, err)
	}
	switch {
	case f == 0:
		return IDRange{}, fmt.Errorf("agent id range %q includes 0: agent commands never run as host root", s)
	case c == 0:
		return IDRange{}, fmt.Errorf("agent id range %q is empty", s)
	case f+c-1 >= 1<<32-1:
		// 2^32-1 is (uid_t)-1, which chown and setuid read as "unchanged".
		return IDRange{}, fmt.Errorf("agent id range %q reaches 4294967295, which the kernel reserves", s)
	}
	return IDRange{First: uint32(f), Count: uint32(c)}, nil
}

// Identities hands each agent directory under an areas root one id of a
// range. The record of the allocation is the owner of the agent's directory
// itself: it survives restarts, needs no other state, and is what the
// kernel checks anyway. Allocation holds a lock file in the root, so two
// processes sharing a root never hand out one id twice.
type Identities struct {
	root string
	ids  IDRange
	mu   sync.Mutex
}

// NewIdentities allocates ids from ids for the agent directories in root.
func NewIdentities(root string, ids IDRange) (*Identities, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("areas root %q must be an absolute path", root)
	}
	if ids.First == 0 || ids.Count == 0 {
		return nil, fmt.Errorf("agent id range %s is empty or includes 0", ids)
	}
	return &Identities{root: filepath.Clean(root), ids: ids}, nil
}

// Range is the range ids come from.
func (a *Identities) Range() IDRange { return a.ids }

// ErrNoIdentity is wrapped when an agent has not been given an id yet (its
// directory is missing, or not owned by an id of the range).
var ErrNoIdentity = errors.New("the agent has no host identity yet")

// Lookup returns the id agent was given, reading only: it never creates,
// chowns or renames anything. An agent without one is ErrNoIdentity.
func (a *Identities) Lookup(agent string) (uint32, error) {
	if agent == "" || strings.ContainsAny(agent, "/\x00") || agent == "." || agent == ".." {
		return 0, fmt.Errorf("agent name %q is not a directory name", agent)
	}
	if id, ok := a.owned(filepath.Join(a.root, agent)); ok {
		return id, nil
	}
	return 0, fmt.Errorf("agent %s in %s: %w", agent, a.root, ErrNoIdentity)
}

// For returns the id of agent, allocating the lowest free one and creating
// the agent's directory (mode 0700, owned by it) when the agent has none.
// An existing directory owned by an id outside the range (areas laid out
// before agents had identities, or copied in) is taken over: it and
// everything beneath it are given to the new id, without following links.
func (a *Identities) For(agent string) (uint32, error) {
	if agent == "" || strings.ContainsAny(agent, "/\x00") || agent == "." || agent == ".." {
		return 0, fmt.Errorf("agent name %q is not a directory name", agent)
	}
	dir := filepath.Join(a.root, agent)
	if id, ok := a.owned(dir); ok {
		return id, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := ensureDir(a.root, true); err != nil {
		return 0, err
	}
	unlock, err := lockFile(filepath.Join(a.root, ".identities.lock"))
	if err != nil {
		return 0, err
	}
	defer unlock()
	if id, ok := a.owned(dir); ok {
		return id, nil
	}
	id, err := a.free()
	if err != nil {
		return 0, err
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		// Made under another name and renamed into place, so that the
		// directory is never seen owned by anyone but the agent.
		tmp := filepath.Join(a.root, ".new-"+agent)
		_ = os.Remove(tmp)
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return 0, fmt.Errorf("creating agent directory %s: %w", dir, err)
		}
		if err := os.Lchown(tmp, int(id), int(id)); err != nil {
			_ = os.Remove(tmp)
			return 0, fmt.Errorf("giving agent directory %s to id %d: %w", dir, id, err)
		}
		if err := os.Rename(tmp, dir); err != nil {
			_ = os.Remove(tmp)
			return 0, fmt.Errorf("creating agent directory %s: %w", dir, err)
		}
		return id, nil
	}
	if err := giveTree(dir, id); err != nil {
		return 0, fmt.Errorf("giving agent directory %s to id %d: %w", dir, id, err)
	}
	return id, nil
}

// owned reports the id of dir when it is a directory owned by an id of the
// range (uid and gid equal).
func (a *Identities) owned(dir string) (uint32, bool) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, false
	}
	if st.Uid != st.Gid || !a.ids.Contains(st.Uid) {
		return 0, false
	}
	return st.Uid, true
}

// free is the lowest id of the range no agent directory in the root owns.
func (a *Identities) free() (uint32, error) {
	entries, err := os.ReadDir(a.root)
	if err != nil {
		return 0, fmt.Errorf("listing agent directories in %s: %w", a.root, err)
	}
	used := map[uint32]bool{}
	for _, e := range entries {
		if id, ok := a.owned(filepath.Join(a.root, e.Name())); ok {
			used[id] = true
		}
	}
	for i := uint32(0); i < a.ids.Count; i++ {
		if !used[a.ids.First+i] {
			return a.ids.First + i, nil
		}
	}
	return 0, fmt.Errorf("agent id range %s is exhausted: %d agents in %s; give the controller a larger range", a.ids, len(used), a.root)
}

func lockFile(path string) (func(), error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { unix.Close(fd) }, nil
}

// giveTree makes id the owner of dir and everything beneath it, through
// descriptors and without following links. A regular file with more than one
// link is left alone: it may be a hard link to a file outside the areas,
// and taking that over would hand a host file to the agent.
func giveTree(dir string, id uint32) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return giveDir(fd, dir, id, 0)
}

// maxGiveDepth bounds the walk; deeper trees keep their old owners below it.
const maxGiveDepth = 256

func giveDir(fd int, shown string, id uint32, depth int) error {
	d := os.NewFile(uintptr(fd), shown)
	defer d.Close()
	if err := unix.Fchown(fd, int(id), int(id)); err != nil {
		return fmt.Errorf("%s: %w", shown, err)
	}
	if depth >= maxGiveDepth {
		return nil
	}
	for {
		names, err := d.Readdirnames(1024)
		for _, n := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue
			}
			switch {
			case st.Mode&unix.S_IFMT == unix.S_IFDIR:
				sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					continue
				}
				if err := giveDir(sub, shown+"/"+n, id, depth+1); err != nil {
					return err
				}
			case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1:
			default:
				if err := unix.Fchownat(fd, n, int(id), int(id), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("%s/%s: %w", shown, n, err)
				}
			}
		}
		if errors.Is(err, io.EOF) || len(names) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", shown, err)
		}
	}
}
