//go:build linux

package areas

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/fdfile"
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
	if _, err := ensureDir(a.root, true); err != nil {
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
	id, commit, err := a.free(agent)
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
		// The index knows this new directory: the root as it is now is
		// what it describes.
		if err := commit(); err != nil {
			return 0, err
		}
		return id, nil
	}
	if err := giveTree(dir, id); err != nil {
		return 0, fmt.Errorf("giving agent directory %s to id %d: %w", dir, id, err)
	}
	if err := commit(); err != nil {
		return 0, err
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

// The index of allocated ids lives beside the agents' directories, in
// indexDir (a name no agent can have: agent names never start with a dot):
// one symbolic link per id, named by the id, pointing at the agent's name.
// Claiming an id is creating its link, which fails when it exists, so two
// allocators never take one id, and an allocation costs a few system
// calls whatever the number of agents. The owners of the agents'
// directories stay the record: the index is rebuilt from them when this
// process has not built it yet or the root changed behind its back (an
// agent directory made or removed by anything but this process's
// allocations), and a link naming an agent whose directory that id no
// longer owns (the agent was removed, or an allocation died before making
// its directory) is stale and taken again. Per range, allocation starts
// after the last id handed out, so ids come in order and those of removed
// agents come back once the range has wrapped.
const indexDir = ".ids"

// indexMemo is what this process knows of a root's index.
type indexMemo struct {
	// stamp is the root as it was when the index last knew it.
	stamp string
	// owned are the ids the index's last rebuild found, sorted.
	owned []uint32
	// next is, per range, the id the next allocation tries first.
	next map[IDRange]uint32
}

var (
	indexMemosMu sync.Mutex
	indexMemos   = map[string]*indexMemo{}
)

// rootStamp says what the root directory looks like now: its times, link
// count and inode change whenever an entry is added, removed or renamed
// there.
func (a *Identities) rootStamp() (string, error) {
	var st unix.Stat_t
	if err := unix.Lstat(a.root, &st); err != nil {
		return "", fmt.Errorf("reading %s: %w", a.root, err)
	}
	return fmt.Sprintf("%d.%09d %d.%09d %d %d", st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Nlink, st.Ino), nil
}

// free claims an id of the range for agent in the index and returns it,
// with commit to call once the agent's directory is made. The caller holds
// the lock file.
func (a *Identities) free(agent string) (uint32, func() error, error) {
	indexMemosMu.Lock()
	defer indexMemosMu.Unlock()
	memo, err := a.ensureIndex()
	if err != nil {
		return 0, nil, err
	}
	start, ok := memo.next[a.ids]
	if !ok {
		// After the highest id of the range the rebuild found.
		start = a.ids.First
		for _, id := range memo.owned {
			if a.ids.Contains(id) {
				start = id + 1
			}
		}
		if !a.ids.Contains(start) {
			start = a.ids.First
		}
	}
	for i := uint32(0); i < a.ids.Count; i++ {
		id := a.ids.First + (start-a.ids.First+i)%a.ids.Count
		ok, err := a.claim(id, agent)
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			continue
		}
		commit := func() error {
			indexMemosMu.Lock()
			defer indexMemosMu.Unlock()
			memo.next[a.ids] = a.ids.First + (id-a.ids.First+1)%a.ids.Count
			stamp, err := a.rootStamp()
			if err != nil {
				return err
			}
			memo.stamp = stamp
			return nil
		}
		return id, commit, nil
	}
	return 0, nil, fmt.Errorf("agent id range %s is exhausted: every id has an agent directory in %s; give the controller a larger range", a.ids, a.root)
}

// claim takes id for agent in the index: false when another agent holds
// it.
func (a *Identities) claim(id uint32, agent string) (bool, error) {
	link := filepath.Join(a.root, indexDir, strconv.FormatUint(uint64(id), 10))
	for range 2 {
		err := os.Symlink(agent, link)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("claiming agent id %d in %s: %w", id, filepath.Dir(link), err)
		}
		holder, rerr := os.Readlink(link)
		if rerr != nil {
			// Not a link: something else sits there; leave the id alone.
			return false, nil //nolint:nilerr // an id whose entry cannot be read is taken, not an error
		}
		if holder == agent {
			return true, nil
		}
		if got, ok := a.owned(filepath.Join(a.root, filepath.Base(holder))); ok && got == id {
			return false, nil
		}
		// Stale: its agent's directory is gone or has another id.
		if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("releasing stale agent id %d in %s: %w", id, filepath.Dir(link), err)
		}
	}
	return false, nil
}

// ensureIndex builds the index from the owners of the agents' directories
// when this process has not, or the root changed since it last knew it.
// Every directory owned by an id (uid and gid equal, not root) is marked,
// whatever the range: ranges of different classes share the root. The
// caller holds indexMemosMu and the lock file.
func (a *Identities) ensureIndex() (*indexMemo, error) {
	stamp, err := a.rootStamp()
	if err != nil {
		return nil, err
	}
	memo := indexMemos[a.root]
	if memo != nil && memo.stamp == stamp {
		return memo, nil
	}
	dir := filepath.Join(a.root, indexDir)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("removing the stale agent id index %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the agent id index %s: %w", dir, err)
	}
	entries, err := os.ReadDir(a.root)
	if err != nil {
		return nil, fmt.Errorf("listing agent directories in %s: %w", a.root, err)
	}
	fresh := &indexMemo{next: map[IDRange]uint32{}}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var fi unix.Stat_t
		if err := unix.Lstat(filepath.Join(a.root, e.Name()), &fi); err != nil || fi.Mode&unix.S_IFMT != unix.S_IFDIR || fi.Uid != fi.Gid || fi.Uid == 0 {
			continue
		}
		link := filepath.Join(dir, strconv.FormatUint(uint64(fi.Uid), 10))
		if err := os.Symlink(e.Name(), link); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("indexing agent %s: %w", e.Name(), err)
		}
		fresh.owned = append(fresh.owned, fi.Uid)
	}
	slices.Sort(fresh.owned)
	// Made after the index directory: the root as the index knows it.
	if fresh.stamp, err = a.rootStamp(); err != nil {
		return nil, err
	}
	indexMemos[a.root] = fresh
	return fresh, nil
}

func lockFile(path string) (func(), error) {
	return fdfile.Lock(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW, 0o600)
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

// giveEntry gives the non-directory name of dir to id. The name is held
// first (O_PATH, not following a link) and the held object's link count
// decides, so a name swapped for a hard link to a host file between the
// listing's look and the chown is left alone rather than taken.
func giveEntry(dir int, name string, id uint32) error {
	fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// Swapped in after the look: the next take-over walks it.
		return nil
	case unix.S_IFREG:
		if st.Nlink > 1 {
			return nil
		}
	}
	return unix.Fchownat(fd, "", int(id), int(id), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
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
				if err := giveEntry(fd, n, id); err != nil {
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
