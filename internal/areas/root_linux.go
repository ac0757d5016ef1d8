//go:build linux

package areas

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// sysCalls holds the syscalls a test needs to replace; everything else is
// called directly.
type sysCalls struct {
	openat2 func(dirfd int, path string, how *unix.OpenHow) (int, error)
}

// defaultSys is what OpenRoot gives a new Root. Tests swap it to simulate a
// kernel without openat2.
var defaultSys = sysCalls{openat2: unix.Openat2}

// resolveFlags confine a lookup to the root: BENEATH refuses absolute
// links and ".." above the starting directory, NO_MAGICLINKS refuses
// /proc/<pid>/fd-style links, which jump without regard to the path.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

// maxRetries bounds retries of EAGAIN, which openat2 returns for a lookup
// containing ".." when a rename raced with it; it is a hint to try again,
// not a failure.
const maxRetries = 64

// OpenRoot registers hostPath as a root resolved beneath "/": links on the
// way are followed as the host follows them, magic links never. Use
// OpenRootAt for a directory a tenant or an agent can reach.
func OpenRoot(name, hostPath string, readOnly bool) (*Root, error) {
	if !filepath.IsAbs(hostPath) {
		return nil, fmt.Errorf("opening root %q: host path %q is not absolute", name, hostPath)
	}
	return OpenRootAt(name, HostDir{Path: filepath.Clean(hostPath)}, readOnly)
}

// OpenRootAt registers dir as a root. The directory it resolves to now is
// recorded (device and inode), and every later access resolves dir again
// from its anchor and refuses to go on unless it finds that directory. It
// also fails with ErrUnsupportedPlatform when the kernel lacks openat2, so
// that a missing syscall shows at registration.
func OpenRootAt(name string, dir HostDir, readOnly bool) (*Root, error) {
	fd, err := dir.open()
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("opening root %q: %w (it is not a directory)", name, err)
		}
		return nil, fmt.Errorf("opening root %q: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("opening root %q: stat %s: %w", name, dir.Path, err)
	}
	r := &Root{name: name, dir: dir, readOnly: readOnly, dev: st.Dev, ino: st.Ino, sys: defaultSys}
	probe, err := r.sys.openat2(fd, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags})
	switch {
	case errors.Is(err, unix.ENOSYS):
		return nil, fmt.Errorf("opening root %q: the kernel has no openat2 (ENOSYS): %w", name, ErrUnsupportedPlatform)
	case errors.Is(err, unix.EPERM):
		// Opening "." with O_PATH cannot be refused by permissions, so
		// EPERM here means a seccomp filter blocks the syscall.
		return nil, fmt.Errorf("opening root %q: openat2 is blocked (EPERM, likely a seccomp profile): %w", name, ErrUnsupportedPlatform)
	case err != nil:
		return nil, fmt.Errorf("opening root %q: checking openat2 on %s: %w", name, dir.Path, err)
	}
	unix.Close(probe)
	return r, nil
}

// openRoot resolves the root again from its anchor, as the controller
// (the agent may not be able to reach its own root's parents), and checks
// it is still the registered directory: the inode check catches a root
// removed and replaced, or reached through a component swapped since.
func (r *Root) openRoot(op, rel string) (int, error) {
	fd := -1
	err := asController(func() error {
		var err error
		fd, err = r.dir.open()
		return err
	})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, ErrEscape) {
			return -1, r.wrap(op, rel, fmt.Errorf("%w (reopening it: %w)", ErrRootReplaced, err))
		}
		return -1, r.wrap(op, rel, fmt.Errorf("reopening the root: %w", err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, r.wrap(op, rel, fmt.Errorf("checking the root: %w", err))
	}
	if st.Dev != r.dev || st.Ino != r.ino {
		unix.Close(fd)
		return -1, r.wrap(op, rel, fmt.Errorf("%w (registered device %d inode %d, found device %d inode %d)", ErrRootReplaced, r.dev, r.ino, st.Dev, st.Ino))
	}
	return fd, nil
}

// beneath opens rel relative to dirfd, which must be the verified root, and
// turns the kernel's refusals into this package's errors. Errors name shown,
// the path the caller gave, which may be longer than rel (the parent).
func (r *Root) beneath(dirfd int, op, shown, rel string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if flags&unix.O_PATH == 0 {
		// openat2 rejects O_PATH combined with flags that only matter for
		// I/O, so O_NOCTTY is added for real opens only.
		flags |= unix.O_NOCTTY
	}
	how := &unix.OpenHow{Flags: uint64(flags), Resolve: resolveFlags}
	var fd int
	var err error
	for range maxRetries {
		fd, err = r.sys.openat2(dirfd, rel, how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.EXDEV):
		return -1, &EscapeError{Op: op, Path: shown, Root: r.name, RootPath: r.dir.Path, Err: err}
	case errors.Is(err, unix.ENOSYS):
		return -1, r.wrap(op, shown, fmt.Errorf("the kernel has no openat2 (ENOSYS): %w", ErrUnsupportedPlatform))
	case errors.Is(err, unix.EAGAIN):
		return -1, r.wrap(op, shown, fmt.Errorf("the lookup kept racing with renames, gave up after %d tries: %w", maxRetries, err))
	case errors.Is(err, unix.ELOOP):
		return -1, r.wrap(op, shown, fmt.Errorf("too many symbolic links, or a /proc magic link, which is refused: %w", err))
	default:
		return -1, r.wrap(op, shown, err)
	}
}

// at checks rel, reopens the verified root and opens rel beneath it; errors
// name shown, as for beneath.
func (r *Root) at(op, shown, rel string, flags int) (int, error) {
	rel, err := r.checkRel(op, rel)
	if err != nil {
		return -1, err
	}
	root, err := r.openRoot(op, shown)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	return r.beneath(root, op, shown, rel, flags)
}

func (r *Root) refuseReadOnly(op, rel string) error {
	if r.readOnly {
		return r.wrap(op, rel, ErrReadOnly)
	}
	return nil
}

// Open opens a regular file for reading. Symbolic links are followed while
// they stay inside the root. Anything but a regular file is refused: a FIFO
// would block the caller and a device node has no business in an area.
func (r *Root) Open(rel string) (*os.File, error) {
	return actV(r, func() (*os.File, error) { return r.open("opening", rel) })
}

func (r *Root) open(op, rel string) (*os.File, error) {
	// O_NONBLOCK so that opening a FIFO cannot hang before the type check.
	fd, err := r.at(op, rel, rel, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, r.wrap(op, rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, r.wrap(op, rel, fmt.Errorf("not a regular file (it is a %s)", typeOf(fileMode(st.Mode))))
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, r.wrap(op, rel, err)
	}
	return os.NewFile(uintptr(fd), r.name+"/"+rel), nil
}

// OpenDir opens a directory as a path handle (O_PATH), for binding it into
// a sandbox by descriptor: what the handle names was resolved beneath the
// root, so a symbolic link swapped in afterwards cannot redirect the bind.
// rel "" is the root itself.
func (r *Root) OpenDir(rel string) (*os.File, error) {
	return actV(r, func() (*os.File, error) { return r.openDir(rel) })
}

// openDir is the body of OpenDir, which runs it as the root's identity (act).
func (r *Root) openDir(rel string) (*os.File, error) {
	const op = "opening directory"
	if rel == "" {
		fd, err := r.openRoot(op, rel)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), r.name), nil
	}
	fd, err := r.at(op, rel, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), r.name+"/"+rel), nil
}

// MaxRead is the most Read returns: larger files are streamed with Open.
const MaxRead = 16 << 20

// ErrTooLarge is wrapped when a file is larger than Read takes.
var ErrTooLarge = errors.New("the file is larger than a whole read takes")

// Read returns the contents of a regular file, at most MaxRead bytes (an
// agent's sparse file never becomes an allocation of its size); see Open.
func (r *Root) Read(rel string) ([]byte, error) {
	return actV(r, func() ([]byte, error) { return r.read(rel) })
}

// read is the body of Read, which runs it as the root's identity (act).
func (r *Root) read(rel string) ([]byte, error) {
	f, err := r.open("reading", rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxRead+1))
	if err != nil {
		return nil, r.wrap("reading", rel, err)
	}
	if len(b) > MaxRead {
		return nil, r.wrap("reading", rel, fmt.Errorf("%w (%d bytes at most)", ErrTooLarge, MaxRead))
	}
	return b, nil
}

// Stat describes the file rel leads to, following symbolic links while they
// stay inside the root.
func (r *Root) Stat(rel string) (Entry, error) {
	return actV(r, func() (Entry, error) { return r.stat("stat", rel, unix.O_PATH) })
}

// Lstat is Stat without following a final symbolic link; the directories on
// the way are still followed while they stay inside the root.
func (r *Root) Lstat(rel string) (Entry, error) {
	return actV(r, func() (Entry, error) { return r.stat("lstat", rel, unix.O_PATH|unix.O_NOFOLLOW) })
}

func (r *Root) stat(op, rel string, flags int) (Entry, error) {
	// O_PATH opens without reading, so a FIFO or device is never touched,
	// and with O_NOFOLLOW it yields the link itself.
	fd, err := r.at(op, rel, rel, flags)
	if err != nil {
		return Entry{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, r.wrap(op, rel, err)
	}
	name := "."
	if c := components(rel); len(c) > 0 {
		name = c[len(c)-1]
	}
	return entryOf(name, &st), nil
}

// List describes the entries of a directory, sorted by name. Entries are
// not followed: a symbolic link is listed as a link.
func (r *Root) List(rel string) ([]Entry, error) {
	return r.ListAtMost(rel, MaxListEntries)
}

// ListAtMost is List of a directory of at most max entries: past them it
// stops reading and fails with ErrTooManyEntries. The directory is the
// agent's, and so is how many names it holds; each costs a stat and
// memory.
func (r *Root) ListAtMost(rel string, max int) ([]Entry, error) {
	return actV(r, func() ([]Entry, error) { return r.list(rel, max) })
}

// list is the body of List, which runs it as the root's identity (act).
func (r *Root) list(rel string, max int) ([]Entry, error) {
	const op = "listing"
	fd, err := r.at(op, rel, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	dir := os.NewFile(uintptr(fd), r.name+"/"+rel)
	defer dir.Close()
	// Readdirnames only reads the descriptor; os.File.ReadDir would stat
	// each entry by a path string, which is what this package avoids.
	var names []string
	for {
		batch, err := dir.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > max {
			return nil, r.wrap(op, rel, fmt.Errorf("%w (%d)", ErrTooManyEntries, max))
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return nil, r.wrap(op, rel, err)
		}
	}
	slices.Sort(names)
	return r.statEntries(op, rel, fd, names)
}

// eachBatch is how many entries Each reads, stats and hands on at once.
const eachBatch = 256

// Each gives fn the entries of directory rel, in the directory's order, a
// batch at a time: what it holds at once is one batch, however many names
// the agent made (List holds them all, to sort them). The names are
// counted first, so that a directory of more than max fails with
// ErrTooManyEntries before fn sees any; names made after the count are
// not given past max, and a name removed meanwhile is left out. Entries
// are not followed. fn's error ends it and is returned as it is.
func (r *Root) Each(rel string, max int, fn func([]Entry) error) error {
	const op = "listing"
	fd, err := actV(r, func() (int, error) { return r.at(op, rel, rel, unix.O_RDONLY|unix.O_DIRECTORY) })
	if err != nil {
		return err
	}
	dir := os.NewFile(uintptr(fd), r.name+"/"+rel)
	defer dir.Close()
	// Reading names needs nothing of the identity that opened the
	// directory; a stat beneath it does.
	n := 0
	for {
		batch, err := dir.Readdirnames(1024)
		if n += len(batch); n > max {
			return r.wrap(op, rel, fmt.Errorf("%w (%d)", ErrTooManyEntries, max))
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return r.wrap(op, rel, err)
		}
	}
	if _, err := dir.Seek(0, io.SeekStart); err != nil {
		return r.wrap(op, rel, err)
	}
	given := 0
	for given < max {
		names, err := dir.Readdirnames(min(eachBatch, max-given))
		if len(names) > 0 {
			entries, serr := actV(r, func() ([]Entry, error) { return r.statEntries(op, rel, fd, names) })
			if serr != nil {
				return serr
			}
			given += len(names)
			if len(entries) > 0 {
				if ferr := fn(entries); ferr != nil {
					return ferr
				}
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			return nil
		}
		if err != nil {
			return r.wrap(op, rel, err)
		}
	}
	return nil
}

// statEntries describes names, entries of the directory fd (rel), without
// following them; a name removed since it was read is left out.
func (r *Root) statEntries(op, rel string, fd int, names []string) ([]Entry, error) {
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, r.wrap(op, rel, fmt.Errorf("stat of entry %q: %w", n, err))
		}
		out = append(out, entryOf(n, &st))
	}
	return out, nil
}

// Write replaces rel with a regular file holding data, atomically: readers
// see the old file or the new one, never a part. The parent directory is
// opened once, beneath the root, and the temporary file is created and
// renamed inside that descriptor. A symbolic link at rel is replaced, not
// written through. perm is applied exactly (only its permission bits),
// whatever the process umask.
func (r *Root) Write(rel string, data []byte, perm os.FileMode) error {
	return r.act(func() error { return r.write(rel, data, perm) })
}

// write is the body of Write, which runs it as the root's identity (act).
func (r *Root) write(rel string, data []byte, perm os.FileMode) error {
	const op = "writing"
	if err := r.refuseReadOnly(op, rel); err != nil {
		return err
	}
	if _, err := r.checkRel(op, rel); err != nil {
		return err
	}
	if strings.HasSuffix(rel, "/") {
		return r.wrap(op, rel, fmt.Errorf("%w: the path ends in \"/\" and so names a directory, not a file", ErrInvalidPath))
	}
	dir, name, err := r.splitEntry(op, rel)
	if err != nil {
		return err
	}
	pfd, err := r.at(op, rel, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	tmp, tfd, err := createTemp(pfd)
	if err != nil {
		return r.wrap(op, rel, fmt.Errorf("creating a temporary file beside it: %w", err))
	}
	f := os.NewFile(uintptr(tfd), tmp)
	renamed := false
	defer func() {
		f.Close() // a second Close after success only returns an error
		if !renamed {
			_ = unix.Unlinkat(pfd, tmp, 0)
		}
	}()
	if err := f.Chmod(perm.Perm()); err != nil {
		return r.wrap(op, rel, fmt.Errorf("setting the mode: %w", err))
	}
	if _, err := f.Write(data); err != nil {
		return r.wrap(op, rel, err)
	}
	// Sync before the rename so that after a crash the name leads to the
	// old contents or the complete new ones.
	if err := f.Sync(); err != nil {
		return r.wrap(op, rel, fmt.Errorf("syncing: %w", err))
	}
	if err := f.Close(); err != nil {
		return r.wrap(op, rel, err)
	}
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		return r.wrap(op, rel, fmt.Errorf("replacing the file: %w", err))
	}
	renamed = true
	if err := unix.Fsync(pfd); err != nil {
		return r.wrap(op, rel, fmt.Errorf("syncing the directory: %w", err))
	}
	return nil
}

// createTemp makes a new file in the directory dirfd. O_EXCL also means a
// planted symbolic link with the same name is never followed.
func createTemp(dirfd int) (string, int, error) {
	for range 16 {
		name := fmt.Sprintf(".areas-write-%016x.tmp", rand.Uint64())
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		return name, fd, err
	}
	return "", -1, errors.New("no unused temporary name after 16 tries")
}

// dirMode is the mode Mkdir creates directories with, before the umask.
const dirMode = 0o755

// Mkdir creates the directory rel. With parents, missing directories on the
// way are created too, and an existing directory is not an error; each
// level is resolved beneath the root again and created inside the
// descriptor of the level above.
func (r *Root) Mkdir(rel string, parents bool) error {
	return r.act(func() error { return r.mkdir(rel, parents) })
}

// mkdir is the body of Mkdir, which runs it as the root's identity (act).
func (r *Root) mkdir(rel string, parents bool) error {
	const op = "making directory"
	if err := r.refuseReadOnly(op, rel); err != nil {
		return err
	}
	if _, err := r.checkRel(op, rel); err != nil {
		return err
	}
	comps := components(rel)
	if !parents {
		dir, name, err := r.splitEntry(op, rel)
		if err != nil {
			return err
		}
		pfd, err := r.at(op, rel, dir, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		if err := unix.Mkdirat(pfd, name, dirMode); err != nil {
			return r.wrap(op, rel, err)
		}
		return nil
	}
	root, err := r.openRoot(op, rel)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	cur, err := unix.Dup(root)
	if err != nil {
		return r.wrap(op, rel, err)
	}
	defer func() { unix.Close(cur) }()
	for i, c := range comps {
		prefix := strings.Join(comps[:i+1], "/")
		fd, err := r.beneath(root, op, rel, prefix, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil && errors.Is(err, unix.ENOENT) && c != ".." {
			if err := unix.Mkdirat(cur, c, dirMode); err != nil && !errors.Is(err, unix.EEXIST) {
				return r.wrap(op, rel, fmt.Errorf("creating %q: %w", prefix, err))
			}
			fd, err = r.beneath(root, op, rel, prefix, unix.O_PATH|unix.O_DIRECTORY)
		}
		if err != nil {
			return err
		}
		unix.Close(cur)
		cur = fd
	}
	return nil
}

// Remove removes a file, a symbolic link (never its target) or an empty
// directory. With recursive, a directory is removed with its contents;
// the walk acts on directory descriptors, opens each subdirectory with
// O_NOFOLLOW and unlinks links as links, so it never leaves the tree.
func (r *Root) Remove(rel string, recursive bool) error {
	return r.act(func() error { return r.remove(rel, recursive) })
}

// remove is the body of Remove, which runs it as the root's identity (act).
func (r *Root) remove(rel string, recursive bool) error {
	const op = "removing"
	if err := r.refuseReadOnly(op, rel); err != nil {
		return err
	}
	if _, err := r.checkRel(op, rel); err != nil {
		return err
	}
	dir, name, err := r.splitEntry(op, rel)
	if err != nil {
		return err
	}
	pfd, err := r.at(op, rel, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return r.wrap(op, rel, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		err = unix.Unlinkat(pfd, name, 0)
	case recursive:
		err = removeTree(pfd, name)
	default:
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return r.wrap(op, rel, err)
	}
	return nil
}

// removeTree removes the directory name inside dirfd and everything in it.
//
// The tree is the agent's, so its depth and width are too: each level holds
// a descriptor while below it, so a tree deeper than maxRemoveDepth is
// refused (at that depth; what was above it stays); a directory is read a
// batch of names at a time, so one with millions of entries costs no more
// memory than one with a thousand; and a failure deep down is said once,
// with its depth, not wrapped again at every level above it.
func removeTree(dirfd int, name string) error { return removeTreeAt(dirfd, name, 0) }

// removeDirBatch is how many names of a directory are read at once.
const removeDirBatch = 512

func removeTreeAt(dirfd int, name string, depth int) error {
	// where says which entry failed, once: below the top, as the name and
	// its depth (the top's own path is the caller's to say).
	where := func(n string, d int, err error) error {
		if d == 0 {
			return err
		}
		return &treeError{name: n, depth: d, err: err}
	}
	if depth > maxRemoveDepth {
		return where(name, depth, ErrTooDeep)
	}
	// O_NOFOLLOW: if name was swapped for a link since it was checked, the
	// open fails instead of descending into the link's target.
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return where(name, depth, fmt.Errorf("opening the directory: %w", err))
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	// Entries created while removing are picked up by reading again; a
	// bounded number of passes keeps a busy writer from holding us forever.
	for range 8 {
		if _, err := d.Seek(0, io.SeekStart); err != nil {
			return where(name, depth, fmt.Errorf("rereading the directory: %w", err))
		}
		for {
			names, rerr := d.Readdirnames(removeDirBatch)
			for _, n := range names {
				var st unix.Stat_t
				err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW)
				if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
					// Already says where it failed.
					if err := removeTreeAt(fd, n, depth+1); err != nil && !errors.Is(err, unix.ENOENT) {
						return err
					}
					continue
				}
				if err == nil {
					err = unix.Unlinkat(fd, n, 0)
				}
				if err != nil && !errors.Is(err, unix.ENOENT) {
					return where(n, depth+1, err)
				}
			}
			if errors.Is(rerr, io.EOF) || (rerr == nil && len(names) == 0) {
				break
			}
			if rerr != nil {
				return where(name, depth, fmt.Errorf("reading the directory: %w", rerr))
			}
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if !errors.Is(err, unix.ENOTEMPTY) {
			if err != nil {
				return where(name, depth, err)
			}
			return nil
		}
	}
	return where(name, depth, fmt.Errorf("the directory kept gaining entries while it was removed: %w", unix.ENOTEMPTY))
}

// treeError is a failure inside a tree being removed: the entry, how many
// directories down it is, and why.
type treeError struct {
	name  string
	depth int
	err   error
}

func (e *treeError) Error() string {
	return fmt.Sprintf("%q, %d directories down: %v", e.name, e.depth, e.err)
}

func (e *treeError) Unwrap() error { return e.err }

func entryOf(name string, st *unix.Stat_t) Entry {
	m := fileMode(st.Mode)
	return Entry{
		Name:    name,
		Type:    typeOf(m),
		Size:    st.Size,
		Mode:    m,
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
	}
}

func fileMode(mode uint32) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// actV is act for a function with a result.
func actV[T any](r *Root, fn func() (T, error)) (T, error) {
	var v T
	err := r.act(func() error {
		var err error
		v, err = fn()
		return err
	})
	return v, err
}
