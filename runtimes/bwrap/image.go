package bwrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/pattern"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// An instance with an Image runs its commands over the root file system of
// its Pod's container (ImageContainer), which the node's container runtime
// mounts at <ContainerBundles>/<id>/rootfs. Everything in that file system
// is the image author's, hostile as any agent's bytes: it is never walked
// as a path by the controller. The root is opened beneath the bundle
// directory without following any link, then every system directory,
// command and /etc file is opened beneath that root (a link inside the
// image resolves inside the image, never on the node, and never crosses
// into another mount), and bubblewrap binds the descriptors.

// containerIDPattern is the shape of a container ID the driver accepts:
// containerd's, and no path.
var containerIDPattern = pattern.Lazy(`^[0-9a-f]{64}$`)

// imageView is what of an image's root file system one command sees, held
// open: the descriptors bubblewrap binds, in the order Args numbers them.
type imageView struct {
	// system are the top-level system directories: a directory is bound
	// from a descriptor, a link is made again as the same link.
	system []imageEntry
	// commandDirs are the command directories that are directories all
	// the way down, each hidden under a tmpfs, and the allowlisted
	// commands bound back into them.
	commandDirs []string
	commands    []imageEntry
	// etc are the account, loader and certificate files of hostFiles,
	// from the image.
	etc []imageEntry
	// found is the path in the sandbox of each allowlisted command, by
	// name: the first command directory of the search path that holds it.
	found map[string]string
	files []*os.File
}

// imageEntry is one path of the sandbox: bound from files[file], or (file
// -1) a link to target.
type imageEntry struct {
	dest   string
	file   int
	target string
}

// Close closes the held descriptors.
func (v *imageView) Close() {
	if v == nil {
		return
	}
	for _, f := range v.files {
		f.Close()
	}
	v.files = nil
}

// hold adds f to the descriptors and returns its index.
func (v *imageView) hold(fd int, name string) int {
	v.files = append(v.files, os.NewFile(uintptr(fd), name))
	return len(v.files) - 1
}

// openImageRoot opens the root file system of container id below
// bundles, the node runtime's directory of its containers' bundles. It
// refuses an id of another shape, any link on the way, and a root that is
// not a mount of its own (the container is not running: its bundle holds
// an empty directory).
func openImageRoot(bundles, id string) (*os.File, error) {
	if bundles == "" {
		return nil, errors.New("this node's controller does not run image Sandboxes: it was started without --container-bundles (the node runtime's directory of its containers' bundles)")
	}
	if !containerIDPattern().MatchString(id) {
		return nil, fmt.Errorf("the container ID %q of the Sandbox's Pod is not 64 hexadecimal digits", id)
	}
	dir, err := unix.Open(bundles, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the container bundles directory %s: %w", bundles, err)
	}
	defer unix.Close(dir)
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	bundle, err := areas.Openat2(dir, id, &how)
	if err != nil {
		return nil, fmt.Errorf("the bundle of the Pod's container %s is not on this node (%s): %w", short(id), bundles, err)
	}
	defer unix.Close(bundle)
	how.Resolve &^= unix.RESOLVE_NO_XDEV
	root, err := areas.Openat2(bundle, "rootfs", &how)
	if err != nil {
		return nil, fmt.Errorf("opening the root file system of the Pod's container %s: %w", short(id), err)
	}
	bundleMnt, err1 := mountID(bundle)
	rootMnt, err2 := mountID(root)
	if err := errors.Join(err1, err2); err != nil {
		unix.Close(root)
		return nil, fmt.Errorf("the root file system of the Pod's container %s: %w", short(id), err)
	}
	if bundleMnt == rootMnt {
		unix.Close(root)
		return nil, fmt.Errorf("the root file system of the Pod's container %s is not mounted: the container does not run", short(id))
	}
	return os.NewFile(uintptr(root), filepath.Join(bundles, id, "rootfs")), nil
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func mountID(fd int) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		return 0, err
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errors.New("the kernel reports no mount ID")
	}
	return st.Mnt_id, nil
}

// inImage resolves p (relative) beneath root as the image's own processes
// would (an absolute link means the image's root), never leaving root's
// mount, and opens what it names as a path descriptor.
func inImage(root int, p string) (int, error) {
	return areas.Openat2(root, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// realDir opens the directory p (relative) beneath root when every
// component of it is a directory, no link.
func realDir(root int, p string) (int, error) {
	return areas.Openat2(root, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// viewImage opens what a command of an instance allowing binaries sees of
// the image root: the system directories, the allowlisted commands in
// the command directories, and the /etc files. The caller closes it.
func viewImage(root *os.File, binaries []string) *imageView {
	rfd := int(root.Fd())
	v := &imageView{found: map[string]string{}}
	for _, d := range systemDirs {
		name := strings.TrimPrefix(d, "/")
		var st unix.Stat_t
		if err := unix.Fstatat(rfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := readlinkat(rfd, name)
			if err != nil {
				continue
			}
			// Made again inside the sandbox, where it resolves in the
			// sandbox's own tree, as it did in the image.
			v.system = append(v.system, imageEntry{dest: d, file: -1, target: target})
		case unix.S_IFDIR:
			fd, err := realDir(rfd, name)
			if err != nil {
				continue
			}
			v.system = append(v.system, imageEntry{dest: d, file: v.hold(fd, d)})
		}
	}
	for _, d := range commandDirs {
		if !underSystemDir(d) {
			continue
		}
		fd, err := realDir(rfd, strings.TrimPrefix(d, "/"))
		if err != nil {
			// Missing, or reached through a link: what it holds is seen
			// through the directory the link names.
			continue
		}
		unix.Close(fd)
		v.commandDirs = append(v.commandDirs, d)
		for _, b := range binaries {
			p := path.Join(d, b)
			fd, err := inImage(rfd, strings.TrimPrefix(p, "/"))
			if err != nil {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
				// A directory, FIFO, device or socket of that name, or a
				// file nobody may run, is no command.
				unix.Close(fd)
				continue
			}
			v.commands = append(v.commands, imageEntry{dest: p, file: v.hold(fd, p)})
		}
	}
	for _, dir := range filepath.SplitList(policy.MinimalPath) {
		for _, e := range v.commands {
			if b := path.Base(e.dest); path.Dir(e.dest) == dir && v.found[b] == "" {
				v.found[b] = e.dest
			}
		}
	}
	for _, f := range hostFiles {
		fd, err := inImage(rfd, strings.TrimPrefix(f, "/"))
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || (st.Mode&unix.S_IFMT != unix.S_IFREG && st.Mode&unix.S_IFMT != unix.S_IFDIR) {
			unix.Close(fd)
			continue
		}
		v.etc = append(v.etc, imageEntry{dest: f, file: v.hold(fd, f)})
	}
	return v
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", errors.New("link target too long")
	}
	return string(buf[:n]), nil
}

// look is the path in the sandbox of the allowlisted command name.
func (v *imageView) look(name, image string) (string, error) {
	if p := v.found[name]; p != "" {
		return p, nil
	}
	return "", fmt.Errorf("command %q is allowed but not in the image %s (looked in %s, links resolved inside the image)", name, image, policy.MinimalPath)
}

// args are the bwrap arguments that lay the image out: the system
// directories, the command directories holding only the allowlisted
// commands, and the /etc files. Descriptor i of files is base+i.
func (v *imageView) args(a []string, base int) []string {
	fd := func(e imageEntry) string { return strconv.Itoa(base + e.file) }
	for _, e := range v.system {
		if e.file < 0 {
			a = append(a, "--symlink", e.target, e.dest)
		} else {
			a = append(a, "--ro-bind-fd", fd(e), e.dest)
		}
	}
	for _, d := range v.commandDirs {
		a = append(a, "--tmpfs", d)
		for _, e := range v.commands {
			if path.Dir(e.dest) == d {
				a = append(a, "--ro-bind-fd", fd(e), e.dest)
			}
		}
	}
	for _, d := range v.commandDirs {
		a = append(a, "--remount-ro", d)
	}
	for _, e := range v.etc {
		a = append(a, "--ro-bind-fd", fd(e), e.dest)
	}
	return a
}

// openView opens the image view of in, an instance with an Image.
func (r *Runtime) openView(in runtimes.Instance) (*imageView, error) {
	mounted, err := r.mountImage(in)
	if err != nil {
		return nil, err
	}
	defer mounted.Close()
	return viewImage(mounted, in.Binaries), nil
}

// mountImage opens the root file system of in's container and returns
// it as mounted for the agent (imageMount).
func (r *Runtime) mountImage(in runtimes.Instance) (*os.File, error) {
	if in.ImageContainer == "" {
		return nil, fmt.Errorf("the image %s is the file system of the Sandbox's Pod's container, which does not run yet", in.Image)
	}
	root, err := openImageRoot(r.bundles, in.ImageContainer)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return r.imageMount(in.Name, root)
}

// imagesDir, in a driver's directory of trees, holds each instance's
// image mount. Its name starts with a dot, so it is never an instance's.
const imagesDir = ".images"

// imageMount binds the root file system held by root at
// <trees>/.images/<instance>, read-only, and returns it opened: the
// descriptors bubblewrap binds must name paths the agent may search
// (bubblewrap resolves a descriptor's path again as the agent), and the
// runtime keeps its bundles to itself. The mount is kept while it holds
// that root, made again for a new one (the Pod's new container), and
// removed when the instance stops.
func (r *Runtime) imageMount(name string, root *os.File) (*os.File, error) {
	if r.trees == "" {
		return nil, errors.New("an image Sandbox needs the bwrap driver to run as root, which mounts the image for its commands")
	}
	var want unix.Stat_t
	if err := unix.Fstat(int(root.Fd()), &want); err != nil {
		return nil, err
	}
	m := filepath.Join(r.trees, imagesDir, name)
	l := r.treeLock(imagesDir + "/" + name)
	l.Lock()
	defer l.Unlock()
	if f, err := openSame(m, &want); err == nil {
		return f, nil
	}
	if err := detachAll(m); err != nil {
		return nil, err
	}
	err := os.Mkdir(m, 0o755)
	if errors.Is(err, fs.ErrNotExist) {
		// The first image mount of this driver's trees.
		if err = os.Mkdir(filepath.Dir(m), 0o711); err == nil || errors.Is(err, fs.ErrExist) {
			err = os.Mkdir(m, 0o755)
		}
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("preparing the image mount: %w", err)
	}
	// The directory's time, under the mount, says when it was made: a
	// mount not recorded yet is not stale for a while (FindStaleTrees).
	now := time.Now()
	if err := os.Chtimes(m, now, now); err != nil {
		return nil, fmt.Errorf("preparing the image mount: %w", err)
	}
	src := "/proc/self/fd/" + strconv.Itoa(int(root.Fd()))
	if err := unix.Mount(src, m, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("mounting the image for the agent: %w", err)
	}
	if err := unix.Mount("", m, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = detachAll(m)
		return nil, fmt.Errorf("making the image mount read-only: %w", err)
	}
	// A bind of a shared mount is one of its peers: private, so that
	// nothing mounted or unmounted below it reaches the image's own mount.
	if err := unix.Mount("", m, "", unix.MS_PRIVATE, ""); err != nil {
		_ = detachAll(m)
		return nil, fmt.Errorf("making the image mount private: %w", err)
	}
	f, err := openSame(m, &want)
	if err != nil {
		_ = detachAll(m)
		return nil, fmt.Errorf("the image mount %s: %w", m, err)
	}
	return f, nil
}

// openSame opens the directory m, refusing a link, when it is the object
// want describes.
func openSame(m string, want *unix.Stat_t) (*os.File, error) {
	fd, err := unix.Open(m, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != want.Dev || st.Ino != want.Ino {
		unix.Close(fd)
		return nil, errors.New("does not hold the container's root file system")
	}
	return os.NewFile(uintptr(fd), m), nil
}

// detachAll detaches every mount stacked on m.
func detachAll(m string) error {
	for range 64 {
		err := unix.Unmount(m, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("detaching the image mount %s: %w", m, err)
		}
	}
	return fmt.Errorf("detaching the image mount %s: too many mounts stacked on it", m)
}

// removeImageMount detaches and removes the image mount of instance name.
func (r *Runtime) removeImageMount(name string) {
	if r.trees == "" {
		return
	}
	m := filepath.Join(r.trees, imagesDir, name)
	l := r.treeLock(imagesDir + "/" + name)
	l.Lock()
	defer l.Unlock()
	_ = dropImageMount(m)
}

// dropImageMount detaches the image mount m and removes its directory.
func dropImageMount(m string) error {
	if err := detachAll(m); err != nil {
		return err
	}
	if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// removeImageMounts detaches and removes every image mount below the
// trees directory dir, and the directory that held them.
func removeImageMounts(dir string) error {
	entries, err := os.ReadDir(filepath.Join(dir, imagesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, dropImageMount(filepath.Join(dir, imagesDir, e.Name())))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, imagesDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
