//go:build linux

// Package mounttree builds, in the controller's own mount namespace, the
// trees a sandbox's areas are made of: each area bound at a directory only
// the controller writes, and the custom mounts bound beneath the workspace.
// A sandbox then receives each area in one recursive bind from a path no
// agent can change, at a destination the agent cannot write (/workspace in
// the sandbox's fresh root), instead of having bubblewrap or runc bind each
// custom mount by a path inside the agent-writable workspace, which an agent
// redirects with a symbolic link.
//
// Every destination is created and opened beneath the tree's root with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and every mount is attached
// with move_mount(2) onto that descriptor: nothing here resolves a path the
// agent controls twice, and a link anywhere on a destination's path is
// refused, never followed. This package must never mount by a path below
// the tree's root, and never remove anything from the agent's areas.
package mounttree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/fdfile"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Bind is one custom mount: Source on the host, bound at Rel below the
// tree's root (the workspace).
type Bind struct {
	Source   areas.HostDir
	Rel      string
	ReadOnly bool
}

// Area is one standard area: Source on the host, bound at Dir/Name.
type Area struct {
	Name     string
	Source   areas.HostDir
	ReadOnly bool
}

// For is the tree of in: its areas, with the custom mounts (overlay merged
// views included) beneath the area mounted at /workspace. Git directory
// binds are not in it: they come and go while the sandbox runs.
func For(in runtimes.Instance) Tree {
	t := Tree{Workspace: strings.TrimPrefix(policy.SandboxHome, "/"), Owner: in.Identity.UID, Group: in.Identity.GID}
	for _, a := range in.Areas {
		t.Areas = append(t.Areas, Area{Name: strings.TrimPrefix(a.Target, "/"), Source: in.SourceDir(a), ReadOnly: a.ReadOnly})
	}
	for _, m := range in.Mounts {
		if rel, ok := strings.CutPrefix(m.Target, policy.SandboxHome+"/"); ok && !m.GitDir {
			t.Binds = append(t.Binds, Bind{Source: in.SourceDir(m), Rel: rel, ReadOnly: m.ReadOnly})
		}
	}
	return t
}

// Tree is the mount trees of one sandbox below Dir, a directory only the
// controller writes (agents may search it: they reach their areas through
// it).
type Tree struct {
	Dir   string
	Areas []Area
	// Workspace names the area the custom mounts are bound beneath.
	Workspace string
	Binds     []Bind
	// Owner is the agent's id: directories created as mount points in the
	// workspace belong to it.
	Owner uint32
	// Group is the agent's group. With an Owner, Dir is root's and this
	// group's alone to search (dirMode): the areas' own directories are
	// open to every user, and the trees' directories above Dir are
	// searchable by all (every agent reaches its own tree through them),
	// so a tree open to all let any user of the host read every agent's
	// areas, past the agent's own directory that keeps them out on the
	// areas root.
	Group uint32
}

// dirMode is the mode and group of Dir: searchable by root and the
// agent's group alone when there is an agent's id, by all otherwise
// (the agent's commands then run as root).
func (t Tree) dirMode() (os.FileMode, uint32) {
	if t.Owner == 0 {
		return 0o711, 0
	}
	return 0o710, t.Group
}

// resolveNoLinks refuses every symbolic link and any escape from the root.
const resolveNoLinks = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Path is where area name is mounted.
func (t Tree) Path(name string) string { return filepath.Join(t.Dir, name) }

// Build replaces whatever is mounted below t.Dir with fresh trees: a bind
// of each area, then each custom mount at its destination below the
// workspace, parents before children.
func (t Tree) Build() error {
	if err := Remove(t.Dir); err != nil {
		return err
	}
	if err := os.MkdirAll(t.Dir, 0o700); err != nil {
		return fmt.Errorf("creating mount tree directory %s: %w", t.Dir, err)
	}
	mode, group := t.dirMode()
	if err := os.Lchown(t.Dir, 0, int(group)); err != nil {
		return fmt.Errorf("giving mount tree directory %s to group %d: %w", t.Dir, group, err)
	}
	if err := os.Chmod(t.Dir, mode); err != nil {
		return fmt.Errorf("creating mount tree directory %s: %w", t.Dir, err)
	}
	for _, a := range t.Areas {
		dir := t.Path(a.Name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			_ = Remove(t.Dir)
			return fmt.Errorf("creating mount point %s: %w", dir, err)
		}
		if err := attach(a.Source, false, a.ReadOnly, func(fd int) error {
			return unix.MoveMount(fd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}); err != nil {
			_ = Remove(t.Dir)
			return fmt.Errorf("binding area %s at %s: %w", a.Source, dir, err)
		}
	}
	root, err := unix.Open(t.Path(t.Workspace), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = Remove(t.Dir)
		return fmt.Errorf("opening mount tree %s: %w", t.Path(t.Workspace), err)
	}
	defer unix.Close(root)
	binds := slices.Clone(t.Binds)
	slices.SortFunc(binds, func(a, b Bind) int { return strings.Compare(a.Rel, b.Rel) })
	for _, b := range binds {
		if err := t.bind(root, b); err != nil {
			_ = Remove(t.Dir)
			return err
		}
	}
	return nil
}

func (t Tree) bind(root int, b Bind) error {
	dest, err := mkdirBeneath(root, b.Rel, t.Owner)
	if err != nil {
		return fmt.Errorf("mount point /workspace/%s: %w", b.Rel, err)
	}
	defer unix.Close(dest)
	err = attach(b.Source, true, b.ReadOnly, func(fd int) error {
		return unix.MoveMount(fd, "", dest, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
	})
	if err != nil {
		return fmt.Errorf("binding %s at /workspace/%s: %w", b.Source, b.Rel, err)
	}
	return nil
}

// attach resolves source once (areas.HostDir: beneath its anchor, no
// magic links), clones the mount at that held directory (with its
// submounts when recursive), makes the clone read-only when asked, always
// nosuid, nodev and private, and hands the detached clone to place.
//
// Private, because a clone of a shared mount (/ on a systemd host, the
// areas volume of a Pod with Bidirectional propagation) joins its peer
// group: a custom mount made in the tree then appeared at its destination
// in the agent's area on the host as well, and detaching a tree unmounted
// the host's own mounts below the area, and the custom mounts of the
// agent's newer trees, which it could force by moving a destination's
// directory until the trees' clean-up ran.
func attach(source areas.HostDir, recursive, readOnly bool, place func(fd int) error) error {
	held, err := source.Open()
	if err != nil {
		return err
	}
	defer held.Close()
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_EMPTY_PATH)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(int(held.Fd()), "", flags)
	if err != nil {
		return fmt.Errorf("cloning %s: %w", source, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	setFlags := uint(unix.AT_EMPTY_PATH)
	if recursive {
		setFlags |= unix.AT_RECURSIVE
	}
	if err := unix.MountSetattr(fd, "", setFlags, &attr); err != nil {
		return fmt.Errorf("setting mount flags of %s: %w", source, err)
	}
	return place(fd)
}

// ErrLinkInPath reports a destination whose path holds a symbolic link or
// something other than a directory: the agent changed it, and it is not
// followed.
var ErrLinkInPath = errors.New("a component is a symbolic link or not a directory (placed there from inside the sandbox?); it is not followed")

// mkdirBeneath creates the directories of rel below root when missing (owned
// by owner) and returns a descriptor of the last, never following a link.
func mkdirBeneath(root int, rel string, owner uint32) (int, error) {
	cur, err := unix.Openat2(root, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveNoLinks})
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(filepath.Clean(rel), "/") {
		if c == "" || c == "." || c == ".." {
			unix.Close(cur)
			return -1, fmt.Errorf("component %q is not allowed", c)
		}
		if err := unix.Mkdirat(cur, c, 0o755); err == nil {
			if owner != 0 {
				if err := unix.Fchownat(cur, c, int(owner), int(owner), unix.AT_SYMLINK_NOFOLLOW); err != nil {
					unix.Close(cur)
					return -1, fmt.Errorf("giving %s to the agent: %w", c, err)
				}
			}
		} else if !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, fmt.Errorf("creating %s: %w", c, err)
		}
		next, err := unix.Openat2(cur, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveNoLinks})
		unix.Close(cur)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return -1, fmt.Errorf("%s: %w", c, ErrLinkInPath)
		}
		if err != nil {
			return -1, fmt.Errorf("opening %s: %w", c, err)
		}
		cur = next
	}
	return cur, nil
}

// Verify reports whether the tree at t.Dir is still what Build made: the
// workspace at its root and each bind's source at its destination, reached
// without following a link. An agent can move a directory holding a mount
// point; the mount moves with it, and Verify then fails so the tree is
// built again.
func (t Tree) Verify() error {
	root, err := t.verifyAreas()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	for _, b := range t.Binds {
		fd, err := unix.Openat2(root, b.Rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveNoLinks})
		if err != nil {
			return fmt.Errorf("mount point /workspace/%s: %w", b.Rel, err)
		}
		err = sameDir(fd, b.Source)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mount point /workspace/%s: %w", b.Rel, err)
		}
	}
	return nil
}

// Blocked reports whether a custom mount's destination path holds a link or
// something other than a directory, which Build would refuse: a new tree
// cannot be built until the agent clears it.
func (t Tree) Blocked() bool {
	root, err := unix.Open(t.Path(t.Workspace), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(root)
	for _, b := range t.Binds {
		fd, err := unix.Openat2(root, b.Rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveNoLinks})
		if err == nil {
			unix.Close(fd)
			continue
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return true
		}
	}
	return false
}

// VerifyAreas reports whether every area is still bound in the tree. The
// custom mounts may have moved with directories the agent renamed; they
// are still the right sources, somewhere inside the workspace.
func (t Tree) VerifyAreas() error {
	root, err := t.verifyAreas()
	if err == nil {
		unix.Close(root)
	}
	return err
}

// verifyAreas checks the areas and returns a descriptor of the workspace's,
// which the caller closes. (It once closed it on return as well: the
// caller then read through, and closed, a descriptor number another
// goroutine might hold by then, which a command start saw as EBADF.)
func (t Tree) verifyAreas() (int, error) {
	root := -1
	fail := func(err error) (int, error) {
		if root >= 0 {
			unix.Close(root)
		}
		return -1, err
	}
	// A tree built open to every user (before dirMode) is built again.
	var st unix.Stat_t
	if err := unix.Lstat(t.Dir, &st); err != nil {
		return fail(fmt.Errorf("mount tree %s: %w", t.Dir, err))
	}
	if mode, group := t.dirMode(); os.FileMode(st.Mode).Perm() != mode || st.Uid != 0 || st.Gid != group {
		return fail(fmt.Errorf("mount tree %s is mode %o, owned by %d:%d, not %o and 0:%d", t.Dir, os.FileMode(st.Mode).Perm(), st.Uid, st.Gid, mode, group))
	}
	for _, a := range t.Areas {
		fd, err := unix.Open(t.Path(a.Name), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("opening mount tree %s: %w", t.Path(a.Name), err))
		}
		if err := sameDir(fd, a.Source); err != nil {
			unix.Close(fd)
			return fail(fmt.Errorf("mount tree %s: %w", t.Path(a.Name), err))
		}
		if a.Name == t.Workspace && root < 0 {
			root = fd
		} else {
			unix.Close(fd)
		}
	}
	if root < 0 {
		return -1, fmt.Errorf("mount tree %s has no area %q", t.Dir, t.Workspace)
	}
	return root, nil
}

// Generations are one sandbox's trees below Dir, numbered. A new tree is
// built beside the one in use and becomes current only once complete; the
// keptGenerations before it stay mounted, because a command may be
// starting from one of them (bubblewrap binds by path, a moment after the
// controller chose the path), and older ones are removed.
type Generations struct {
	Dir string
}

// Current is the newest complete tree's directory, if there is one.
func (g Generations) Current() (string, bool) {
	n, ok := g.newest()
	if !ok {
		return "", false
	}
	return g.path(n), true
}

func (g Generations) path(n int) string { return filepath.Join(g.Dir, strconv.Itoa(n)) }

// newest is the highest generation with a complete tree; a directory left
// by a build that failed halfway has been removed by Build.
func (g Generations) newest() (int, bool) {
	entries, err := os.ReadDir(g.Dir)
	if err != nil {
		return 0, false
	}
	best, found := 0, false
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= 0 && (!found || n > best) {
			best, found = n, true
		}
	}
	return best, found
}

// keptGenerations is how many generations before the newest stay mounted:
// commands starting from them may still be resolving their paths, and an
// agent swapping its sources makes several rebuilds in the time one start
// takes.
const keptGenerations = 3

// Build builds t as the next generation and returns its directory. When
// the build fails, the current tree stays current.
func (g Generations) Build(t Tree) (string, error) {
	if err := os.MkdirAll(g.Dir, 0o711); err != nil {
		return "", fmt.Errorf("creating mount tree directory %s: %w", g.Dir, err)
	}
	n, ok := g.newest()
	if ok {
		n++
	}
	t.Dir = g.path(n)
	if err := t.Build(); err != nil {
		return "", err
	}
	entries, _ := os.ReadDir(g.Dir)
	for _, e := range entries {
		if old, err := strconv.Atoi(e.Name()); err != nil || old < n-keptGenerations {
			// Best effort: one generation that cannot go yet must not
			// keep the others, nor the new tree, from their turn.
			_ = Remove(filepath.Join(g.Dir, e.Name()))
		}
	}
	return t.Dir, nil
}

// Remove detaches and removes every generation.
func (g Generations) Remove() error {
	entries, err := os.ReadDir(g.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing mount trees %s: %w", g.Dir, err)
	}
	for _, e := range entries {
		if err := Remove(filepath.Join(g.Dir, e.Name())); err != nil {
			return err
		}
	}
	if err := unix.Rmdir(g.Dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing mount tree directory %s: %w", g.Dir, err)
	}
	return nil
}

// sameDir checks that the tree's mount at fd holds source as it resolves
// now, held (areas.HostDir), never as a path stat would find it.
func sameDir(fd int, source areas.HostDir) error {
	same, err := areas.SameDir(fd, source)
	if err != nil {
		return err
	}
	if !same {
		return fmt.Errorf("does not hold %s", source)
	}
	return nil
}

// Remove detaches the trees mounted below dir, submounts included, and
// removes the emptied directories. Running sandboxes keep their own copies.
// The detach never reaches the agent's files: only mounts go, and only
// directories the detach emptied are removed.
func Remove(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing mount tree %s: %w", dir, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if err := detach(p); err != nil {
			return err
		}
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing mount point %s: %w", p, err)
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing mount tree directory %s: %w", dir, err)
	}
	return nil
}

func detach(p string) error {
	for range 64 {
		err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("detaching mount tree %s: %w", p, err)
		}
	}
	return fmt.Errorf("detaching mount tree %s: still mounted after 64 detaches", p)
}

// MakePrivate makes dir a mount of its own with private propagation, so
// trees built below it neither propagate to nor receive mounts from the
// rest of the host (where / is shared, as under systemd).
func MakePrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	own, err := isMountRoot(dir)
	if err != nil {
		return err
	}
	if !own {
		if err := bindOnItself(dir); err != nil {
			return err
		}
	}
	return setPropagation(dir, unix.MS_PRIVATE)
}

// bindOnItself makes dir a mount of its own: a recursive bind of itself.
func bindOnItself(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s on itself: %w", dir, err)
	}
	return nil
}

// setPropagation sets the propagation of the mount at dir to each of
// flags in turn (MS_PRIVATE, MS_UNBINDABLE).
func setPropagation(dir string, flags ...uintptr) error {
	for _, f := range flags {
		if err := unix.Mount("", dir, "", f, ""); err != nil {
			what := "private"
			if f == unix.MS_UNBINDABLE {
				what = "unbindable"
			}
			return fmt.Errorf("making %s %s: %w", dir, what, err)
		}
	}
	return nil
}

// isMountRoot says whether dir is the root of a mount of its own.
func isMountRoot(dir string) (bool, error) {
	var self, parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &self); err != nil {
		return false, fmt.Errorf("inspecting %s: %w", dir, err)
	}
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(dir), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &parent); err != nil {
		return false, fmt.Errorf("inspecting %s: %w", filepath.Dir(dir), err)
	}
	return self.Mnt_id != parent.Mnt_id, nil
}

// treesTmpfsOptions are the options of the tmpfs trees are built in: it
// holds only directories (the mount points) and each driver's small owner
// file, and only root writes it; agents search it on the way to their
// areas.
const treesTmpfsOptions = "mode=0711,size=16m"

// MakeTreesMount makes dir the mount trees are built below, private and
// unbindable (a recursive clone or bind of the mounts above it, open_tree
// with AT_RECURSIVE or MS_BIND|MS_REC, leaves it and everything below it
// out), and a tmpfs of its own when it is not a mount yet and holds
// nothing. Building a tree makes a directory for each of its mount
// points, and a directory made on a disk's file system costs its journal
// and its inode tables (on the hosts of docs/benchmarks-scale.md twenty
// times what it costs in a tmpfs); trees never outlive a reboot anyway,
// like the mounts in them, and a tmpfs makes sure their directories do not
// either, wherever dir is. A dir that already holds something, or is
// already a mount (as an earlier version left it: bound on itself, with
// its trees), is kept as it is: a tmpfs over it would hide trees still in
// use. Where no tmpfs can be mounted, dir is bound on itself, as before:
// the tmpfs saves time, the trees do not need it. The check and the mount
// are made under a lock on dir's parent, so that two processes starting
// at once mount one tmpfs.
func MakeTreesMount(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	unlock, err := fdfile.Lock(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unlock()
	own, err := isMountRoot(dir)
	if err != nil {
		return err
	}
	if !own {
		empty, err := isEmptyDir(dir)
		if err != nil {
			return err
		}
		mounted := empty && unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, treesTmpfsOptions) == nil
		if !mounted {
			if err := bindOnItself(dir); err != nil {
				return err
			}
		}
	}
	return setPropagation(dir, unix.MS_PRIVATE, unix.MS_UNBINDABLE)
}

// isEmptyDir says whether dir has no entries.
func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("listing %s: %w", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("listing %s: %w", dir, err)
	}
	return len(names) == 0, nil
}

// Blocker is a component an agent left on the way to a custom mount's
// destination (a symbolic link, a file) and Repair moved aside.
type Blocker struct {
	// Path is the component's sandbox path, from /workspace.
	Path string
	// MovedTo is the name it now has, beside it.
	MovedTo string
}

// Repair moves aside, within the workspace, every symbolic link or
// non-directory an agent left on the way to a custom mount's destination,
// so that a tree can be built again. Nothing is deleted: each one is
// renamed beside itself to <name>.blocked-<unix time>. The workspace is
// held (workspace resolved once, no link followed) and each component is
// reached and renamed through the descriptor of its parent.
func (t Tree) Repair(workspace areas.HostDir, now int64) ([]Blocker, error) {
	ws, err := workspace.Open()
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	var out []Blocker
	for _, b := range t.Binds {
		moved, err := repairPath(int(ws.Fd()), b.Rel, now)
		if err != nil {
			return out, fmt.Errorf("repairing the way to /workspace/%s: %w", b.Rel, err)
		}
		out = append(out, moved...)
	}
	return out, nil
}

func repairPath(root int, rel string, now int64) ([]Blocker, error) {
	cur, err := unix.Dup(root)
	if err != nil {
		return nil, err
	}
	defer func() { unix.Close(cur) }()
	var out []Blocker
	done := "/workspace"
	for _, c := range strings.Split(filepath.Clean(rel), "/") {
		next, err := unix.Openat2(cur, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveNoLinks})
		switch {
		case err == nil:
			unix.Close(cur)
			cur, done = next, done+"/"+c
			continue
		case errors.Is(err, unix.ENOENT):
			// The build creates what is missing.
			return out, nil
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV):
			aside := fmt.Sprintf("%s.blocked-%d", c, now)
			if err := unix.Renameat2(cur, c, cur, aside, unix.RENAME_NOREPLACE); err != nil {
				return out, fmt.Errorf("moving %s/%s aside: %w", done, c, err)
			}
			out = append(out, Blocker{Path: done + "/" + c, MovedTo: aside})
			return out, nil
		default:
			return out, fmt.Errorf("opening %s/%s: %w", done, c, err)
		}
	}
	return out, nil
}

// BindAt binds source, resolved once and held, at dest, a directory only
// the controller writes (created when missing): a clone of the held
// directory's mount with its submounts, nosuid and nodev, read-only when
// asked. A runtime that binds by path (Incus) is given dest, never a path
// a tenant named or an agent can change. Whatever was bound at dest before
// is detached first.
func BindAt(source areas.HostDir, dest string, readOnly bool) error {
	if err := detach(dest); err != nil {
		return err
	}
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dest, err)
	}
	return attach(source, true, readOnly, func(fd int) error {
		return unix.MoveMount(fd, "", unix.AT_FDCWD, dest, unix.MOVE_MOUNT_F_EMPTY_PATH)
	})
}

// Holds reports whether dest is a mount of source as it resolves now.
func Holds(dest string, source areas.HostDir) bool {
	fd, err := unix.Open(dest, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var self, parent unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &self) != nil ||
		unix.Statx(unix.AT_FDCWD, filepath.Dir(dest), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &parent) != nil ||
		self.Mnt_id == parent.Mnt_id {
		return false
	}
	return sameDir(fd, source) == nil
}

// Unbind detaches whatever is bound at dest and removes the directory.
func Unbind(dest string) error {
	if err := detach(dest); err != nil {
		return err
	}
	if err := unix.Rmdir(dest); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", dest, err)
	}
	return nil
}
