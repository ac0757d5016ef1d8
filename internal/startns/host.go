package startns

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// A clone of all of the host's mounts still carries every mount of the
// host: each pod's volumes and each container's root file system on a
// node, each network namespace, overlay and sized area this controller
// holds for its instances outside their trees. bubblewrap copies them and
// reads them again for every read-only bind, so a command's start grew
// with them as it grew with the trees.
//
// A start that says what it needs from the host (Host) gets a namespace
// of just that: the host's root file system without what is mounted on
// it, the mounts on the way to each path it names (each without what is
// mounted below it), and each of its binds with everything mounted below
// it, as bubblewrap binds it. What is needed is named by path and found
// once, at the start, from descriptors: each path is resolved as the
// kernel resolves it for bubblewrap, one component at a time beneath the
// root, each link read from its own descriptor and followed (the
// directories holding them needed too), no magic link; its real path is
// then walked again the same way, no link followed, each component's
// mount told from its parent's by mount id. The clones are taken from
// those descriptors, and attached in the new namespace at descriptors
// reached the same way.

// Host is what a start needs from the host's mounts.
type Host struct {
	// Binds are bound with every mount below them (bubblewrap's bind
	// sources, which it binds recursively).
	Binds []string
	// Paths are read or run (the binaries the start executes): the
	// mounts on their way are there, each without what is mounted below
	// it.
	Paths []string
}

// baseBinds and basePaths are what every start needs besides its own:
// the system's directories (the loader, the libraries and the
// configuration of the binaries the start runs, most binds' sources:
// each bound whole, one clone instead of one a file); /proc (descriptors
// bound by number, the thread's own files), /dev (the device nodes
// bubblewrap binds for --dev) and /sys, each without what is mounted
// below it. bubblewrap reads its whole mount table again for every
// read-only bind, so a mount nothing needs costs each command that many
// reads: the host's /dev/shm and /dev/pts (--dev makes its own), the
// cgroup hierarchies and tracing below /sys. A start that opens cgroups
// by path names their directories (Host.Paths); a bind of /dev or below
// /sys names what it binds.
var (
	baseBinds = []string{"/usr", "/etc"}
	basePaths = []string{"/proc", "/dev", "/sys", "/bin", "/sbin", "/lib", "/lib64", "/tmp"}
)

// placement is a detached clone and where it goes.
type placement struct {
	path string
	fd   int
}

// hostPlan is the host's part of a start namespace: its root and what is
// attached on it, in order.
type hostPlan struct {
	root   int
	places []placement
}

func (p *hostPlan) close() {
	if p == nil {
		return
	}
	if p.root >= 0 {
		unix.Close(p.root)
	}
	for _, pl := range p.places {
		unix.Close(pl.fd)
	}
}

// planHost clones, in the host's mount namespace, what h needs (with the
// base) and the mounts on the way to each of also; it returns nil and
// false when h needs the whole host (a bind of /). What is at or below
// trees (the trees' directory, unbindable) is left to the tree mounts.
func planHost(h *Host, also []string, trees string) (*hostPlan, bool, error) {
	binds, viaBinds, err := realPaths(append(append([]string(nil), baseBinds...), h.Binds...), trees)
	if err != nil {
		return nil, false, err
	}
	paths, viaPaths, err := realPaths(append(append(append([]string(nil), basePaths...), h.Paths...), also...), trees)
	if err != nil {
		return nil, false, err
	}
	// The directories holding the links on the way are passed again by
	// bubblewrap as it resolves: their mounts are needed as a path's.
	paths = append(append(paths, viaBinds...), viaPaths...)
	binds = outermost(binds)
	for _, b := range binds {
		if b == "/" {
			return nil, false, nil
		}
	}
	var kept []string
	for _, p := range paths {
		if !under(p, binds) {
			kept = append(kept, p)
		}
	}
	slash, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("opening /: %w", err)
	}
	defer unix.Close(slash)
	plan := &hostPlan{root: -1}
	w := walker{slash: slash, points: map[string]bool{}}
	var leaves []placement
	ok := false
	defer func() {
		if !ok {
			// The clones made so far, placed or not.
			plan.places = append(w.mounts, leaves...)
			plan.close()
		}
	}()
	if plan.root, err = cloneAt(slash, "/", false); err != nil {
		return nil, false, err
	}
	for _, p := range kept {
		if _, err := w.walk(p, false); err != nil {
			return nil, false, err
		}
	}
	for _, b := range binds {
		fd, err := w.walk(b, true)
		if err != nil {
			return nil, false, err
		}
		if fd >= 0 {
			leaves = append(leaves, placement{path: b, fd: fd})
		}
	}
	// Each mount after the one it sits on, then the binds (no bind is
	// below another, nor above a mount on the way to another).
	sort.SliceStable(w.mounts, func(i, j int) bool { return depth(w.mounts[i].path) < depth(w.mounts[j].path) })
	plan.places = append(w.mounts, leaves...)
	ok = true
	return plan, true, nil
}

// walker walks real paths beneath the root, cloning each mount on the
// way once.
type walker struct {
	slash  int
	points map[string]bool
	mounts []placement
}

// walk walks path (real, absolute) from the root, one component at a
// time and no link followed, and clones each mount on its way that is
// not the root's: alone, the first time it is met. With bind, it returns
// a clone of path with every mount below it (path itself being a mount
// or not), unless path is a file on the mount it is in, which is there
// with that mount: -1 then, as without bind.
func (w *walker) walk(path string, bind bool) (int, error) {
	if path == "/" {
		return -1, nil
	}
	cur, err := unix.Openat2(w.slash, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath})
	if err != nil {
		return -1, err
	}
	defer func() { unix.Close(cur) }()
	curID, err := mountID(cur)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(strings.TrimPrefix(path, "/"), "/")
	mounted := false
	for i, c := range comps {
		next, err := unix.Openat2(cur, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveBeneath})
		if err != nil {
			return -1, fmt.Errorf("opening %s beneath /: %w", path, err)
		}
		unix.Close(cur)
		cur = next
		id, err := mountID(cur)
		if err != nil {
			return -1, err
		}
		prefix := "/" + strings.Join(comps[:i+1], "/")
		mounted = id != curID
		// A bind's own mount comes with its clone below.
		leaf := bind && i == len(comps)-1
		if mounted && !leaf && !w.points[prefix] {
			fd, err := cloneAt(cur, prefix, false)
			if err != nil {
				return -1, err
			}
			w.points[prefix] = true
			w.mounts = append(w.mounts, placement{path: prefix, fd: fd})
		}
		curID = id
	}
	if !bind {
		return -1, nil
	}
	if !mounted {
		var st unix.Stat_t
		if err := unix.Fstat(cur, &st); err != nil {
			return -1, fmt.Errorf("reading %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return -1, nil
		}
	}
	return cloneAt(cur, path, true)
}

// resolveBeneath resolves within a directory descriptor only: no link,
// no magic link, nothing above it.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// attach attaches the plan's clones on the calling thread's root (the
// plan's), each at a descriptor reached beneath it without a link.
func (p *hostPlan) attach() error {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the start namespace's root: %w", err)
	}
	defer unix.Close(root)
	for _, pl := range p.places {
		at, err := unix.Openat2(root, strings.TrimPrefix(pl.path, "/"), &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveBeneath})
		if err != nil {
			return fmt.Errorf("opening %s in the start namespace: %w", pl.path, err)
		}
		err = unix.MoveMount(pl.fd, "", at, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(at)
		if err != nil {
			return fmt.Errorf("attaching %s in the start namespace: %w", pl.path, err)
		}
	}
	return nil
}

// realPaths are the paths the host resolves each of paths to (links
// followed, no magic link), and the directories holding the links
// followed on the way; a path that does not exist has none, nor one at or
// below skip.
func realPaths(paths []string, skip string) (real, via []string, err error) {
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return nil, nil, fmt.Errorf("%q is not an absolute path", p)
		}
		if skip != "" && under(filepath.Clean(p), []string{skip}) {
			continue
		}
		// Most paths have no link on their way: they are where they say.
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		if err == nil {
			unix.Close(fd)
			if filepath.Clean(p) == p {
				real = append(real, p)
				continue
			}
		}
		r, links, ok, err := follow(p)
		if err != nil {
			return nil, nil, fmt.Errorf("resolving %s: %w", p, err)
		}
		if !ok || (skip != "" && under(r, []string{skip})) {
			continue
		}
		real = append(real, r)
		for _, l := range links {
			if skip == "" || !under(l, []string{skip}) {
				via = append(via, l)
			}
		}
	}
	return real, via, nil
}

// maxLinks is how many links a path may pass, as the kernel allows.
const maxLinks = 40

// follow resolves p (absolute) from the root as the kernel resolves it
// for bubblewrap, one component at a time from descriptors: each link is
// read and followed, ".." is taken within what was walked, a magic link
// is refused. It returns the real path p names and the real paths of the
// directories holding the links it passed (their mounts must be there
// too for the kernel to pass them again); ok is false when p names
// nothing.
func follow(p string) (real string, via []string, ok bool, err error) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, false, err
	}
	type step struct {
		fd   int
		name string
	}
	var walked []step
	closeFrom := func(i int) {
		for _, s := range walked[i:] {
			unix.Close(s.fd)
		}
		walked = walked[:i]
	}
	defer func() { closeFrom(0); unix.Close(root) }()
	here := func() (int, string) {
		names := make([]string, len(walked))
		for i, s := range walked {
			names[i] = s.name
		}
		if len(walked) == 0 {
			return root, "/"
		}
		return walked[len(walked)-1].fd, "/" + strings.Join(names, "/")
	}
	todo := strings.Split(p, "/")
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(walked) > 0 {
				closeFrom(len(walked) - 1)
			}
			continue
		}
		dir, dirPath := here()
		fd, err := unix.Openat2(dir, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveBeneath})
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return "", nil, false, nil
		}
		if err != nil {
			return "", nil, false, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return "", nil, false, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			walked = append(walked, step{fd: fd, name: c})
			continue
		}
		var fs unix.Statfs_t
		err = unix.Fstatfs(fd, &fs)
		if err == nil && fs.Type == unix.PROC_SUPER_MAGIC {
			err = fmt.Errorf("%s/%s is a magic link", dirPath, c)
		}
		var target string
		if err == nil {
			links++
			if links > maxLinks {
				err = unix.ELOOP
			}
			buf := make([]byte, unix.PathMax)
			n, rerr := unix.Readlinkat(fd, "", buf)
			target, err = string(buf[:max(n, 0)]), errors.Join(err, rerr)
		}
		unix.Close(fd)
		if err != nil {
			return "", nil, false, err
		}
		via = append(via, dirPath)
		if strings.HasPrefix(target, "/") {
			closeFrom(0)
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	_, real = here()
	return real, via, true, nil
}

// mountID is the id of the mount fd is on.
func mountID(fd int) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		return 0, fmt.Errorf("reading a mount id: %w", err)
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errors.New("reading a mount id: this kernel gives none")
	}
	return st.Mnt_id, nil
}

// cloneAt clones the mount at fd (named what in errors), with every mount
// below it when recursive, as a detached private tree. It leaves fd open.
func cloneAt(fd int, what string, recursive bool) (int, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_EMPTY_PATH
	setFlags := unix.AT_EMPTY_PATH
	if recursive {
		flags |= unix.AT_RECURSIVE
		setFlags |= unix.AT_RECURSIVE
	}
	c, err := unix.OpenTree(fd, "", uint(flags))
	if err != nil {
		return -1, fmt.Errorf("cloning the mounts at %s: %w", what, err)
	}
	if err := unix.MountSetattr(c, "", uint(setFlags), &unix.MountAttr{Propagation: unix.MS_PRIVATE}); err != nil {
		unix.Close(c)
		return -1, fmt.Errorf("making the clone of %s private: %w", what, err)
	}
	return c, nil
}

// under says p is at or below one of dirs.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") || d == "/" {
			return true
		}
	}
	return false
}

func depth(p string) int { return strings.Count(p, "/") }
