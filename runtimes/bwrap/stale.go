package bwrap

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/osthread"
	"github.com/cireilclaw/sandbox-controller/runtimes/cgroup"
	"github.com/cireilclaw/sandbox-controller/runtimes/mounttree"
)

// unrecordedGrace is how long a tree may go without its instance's record
// before it is stale.
const unrecordedGrace = time.Minute

// now is the clock of the stale-tree check.
var now = time.Now

// ownerFile, in a driver's directory of trees, names the state directory
// the trees belong to. Instance names start with a letter, so it never
// collides with one.
const ownerFile = ".state-dir"

// StaleTrees are trees no driver will come back for: those of a state
// directory that no longer exists (a deleted clone, a test's throw-away
// areas, a reinstalled node), and, below a driver's own directory, those
// of instances it no longer records.
type StaleTrees struct {
	// Abandoned are directories of trees (one per state directory) whose
	// state directory is gone, with the state directory they named.
	Abandoned map[string]string
	// Unrecorded are the trees of instances the state directory does not
	// record.
	Unrecorded []string
	// Images are the image mounts of instances the state directory does
	// not record.
	Images []string
}

// Empty says whether there is nothing stale.
func (s StaleTrees) Empty() bool {
	return len(s.Abandoned) == 0 && len(s.Unrecorded) == 0 && len(s.Images) == 0
}

// FindStaleTrees looks below DefaultTreesDir for the trees of state
// directories that are gone, and below stateDir's own trees for those of
// instances it does not record. A directory of trees without an owner
// file (made before owners were recorded) is left alone: whose it is
// cannot be known.
func FindStaleTrees(stateDir string) (StaleTrees, error) {
	st := StaleTrees{Abandoned: map[string]string{}}
	own := defaultTrees(stateDir)
	entries, err := os.ReadDir(DefaultTreesDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("listing %s: %w", DefaultTreesDir, err)
	}
	for _, e := range entries {
		dir := filepath.Join(DefaultTreesDir, e.Name())
		if dir == own || !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		owner := strings.TrimSpace(string(b))
		if !filepath.IsAbs(owner) || defaultTrees(owner) != dir {
			// Not what this driver writes: left alone.
			continue
		}
		if _, err := os.Lstat(owner); errors.Is(err, fs.ErrNotExist) && !heldElsewhere(dir) {
			st.Abandoned[dir] = owner
		}
	}
	names, err := os.ReadDir(own)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("listing %s: %w", own, err)
	}
	for _, e := range names {
		if e.Name() == ownerFile || !e.IsDir() {
			continue
		}
		if e.Name() == imagesDir {
			st.Images = append(st.Images, unrecordedImageMounts(stateDir, filepath.Join(own, imagesDir))...)
			continue
		}
		if _, err := os.Lstat(filepath.Join(stateDir, e.Name()+".json")); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		// A new instance's tree is built just before its record is
		// written, maybe by another process over the same state
		// directory: only a tree that stayed unrecorded a while is stale.
		if fi, err := e.Info(); err == nil && now().Sub(fi.ModTime()) >= unrecordedGrace {
			st.Unrecorded = append(st.Unrecorded, filepath.Join(own, e.Name()))
		}
	}
	return st, nil
}

// unrecordedImageMounts are the image mounts below dir whose instance
// stateDir does not record, and has not for unrecordedGrace: a new
// instance's image is mounted before its record is written, maybe by
// another process over the same state directory.
func unrecordedImageMounts(stateDir, dir string) []string {
	mounts, _ := os.ReadDir(dir)
	var unrecorded []string
	for _, m := range mounts {
		if _, err := os.Lstat(filepath.Join(stateDir, m.Name()+".json")); errors.Is(err, fs.ErrNotExist) {
			unrecorded = append(unrecorded, m.Name())
		}
	}
	if len(unrecorded) == 0 {
		return nil
	}
	made := imageMountsMade(dir, unrecorded)
	var out []string
	for _, name := range unrecorded {
		// A mount whose age cannot be told is left alone, as a tree
		// whose owner cannot be.
		if t, ok := made[name]; ok && now().Sub(t) >= unrecordedGrace {
			out = append(out, filepath.Join(dir, name))
		}
	}
	return out
}

// imageMountsMade says when the image mounts names below dir were made:
// the time of the directory each covers, which imageMount sets just
// before it mounts. Through its path a mount point shows the image's root
// and its times, so the directories are read in a mount namespace of a
// thread's own, all private, where the image mounts are taken away first;
// the host's are untouched. Without that namespace, no time is known.
func imageMountsMade(dir string, names []string) map[string]time.Time {
	made := make(map[string]time.Time, len(names))
	err := osthread.Disposable(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		for _, name := range names {
			p := filepath.Join(dir, name)
			if err := detachAll(p); err != nil {
				continue
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err == nil {
				made[name] = time.Unix(st.Mtim.Unix())
			}
		}
		return nil
	})
	if err != nil {
		return nil
	}
	return made
}

// Remove detaches and removes the stale trees; it goes on past a tree it
// cannot remove and reports every failure.
func (s StaleTrees) Remove() error {
	var errs []error
	for dir, owner := range s.Abandoned {
		errs = append(errs, removeTreesDir(dir))
		// And the cgroups its driver made below the same cgroup as this
		// one, where nothing runs any more: left, they pile up with every
		// throw-away state directory, and each is a watch for a node's
		// cAdvisor.
		errs = append(errs, cgroup.RemoveUnused(cgroupName(owner)))
	}
	for _, g := range s.Unrecorded {
		errs = append(errs, mounttree.Generations{Dir: g}.Remove())
	}
	for _, m := range s.Images {
		errs = append(errs, dropImageMount(m))
	}
	return errors.Join(errs...)
}

// removeTreesDir detaches and removes a directory of trees, one per
// instance, and its owner file.
func removeTreesDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		switch e.Name() {
		case ownerFile:
		case imagesDir:
			errs = append(errs, removeImageMounts(dir))
		default:
			errs = append(errs, mounttree.Generations{Dir: filepath.Join(dir, e.Name())}.Remove())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	letGo(dir)
	if err := os.Remove(filepath.Join(dir, ownerFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// Another process finding the same directory stale (a controller's
	// start, a gc) may have removed it first.
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// RemoveCgroups removes the cgroups a driver over stateDir with the
// default cgroup parent made for its instances, their processes killed:
// an administrator retiring a node, or a benchmark that stopped its
// controller (which keeps them for the next one to adopt).
func RemoveCgroups(stateDir string) error {
	m, err := cgroup.New(cgroupName(stateDir), "")
	if err != nil {
		return err
	}
	return m.RemoveAll()
}

// claimTrees records stateDir as the owner of its directory of trees and
// removes what is stale, at the driver's start: trees never outlive the
// state directory that made them.
func claimTrees(stateDir, trees string) error {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	owner, record := filepath.Join(trees, ownerFile), []byte(filepath.Clean(stateDir)+"\n")
	// Read first: every start of a one-shot run comes here, and the record
	// is there and the same but the first time.
	if b, err := os.ReadFile(owner); err != nil || !bytes.Equal(b, record) {
		if err := os.WriteFile(owner, record, 0o600); err != nil {
			return fmt.Errorf("recording the owner of %s: %w", trees, err)
		}
	}
	if err := holdTrees(trees); err != nil {
		return fmt.Errorf("holding %s: %w", trees, err)
	}
	st, err := FindStaleTrees(stateDir)
	if err != nil {
		return err
	}
	return st.Remove()
}

// heldTrees are the directories of trees this process's drivers hold, by
// directory: the owner file each holds a shared lock on (holdTrees).
var heldTrees sync.Map

// holdTrees locks the owner file of trees, shared, for as long as this
// process lives. Another process may not see the state directory that
// owns them (a service with a /tmp of its own, systemd's PrivateTmp, and
// a state directory below the host's /tmp): the lock tells it that the
// owner is alive, and its sweep leaves them (heldElsewhere).
func holdTrees(trees string) error {
	if _, ok := heldTrees.Load(trees); ok {
		return nil
	}
	f, err := os.Open(filepath.Join(trees, ownerFile))
	if err != nil {
		return err
	}
	// Root's alone: a user who could open it could hold it too, and keep
	// the trees of a state directory that is gone from every sweep. Made
	// readable by all before, it is closed now.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return err
	}
	if _, loaded := heldTrees.LoadOrStore(trees, f); loaded {
		f.Close()
	}
	return nil
}

// heldElsewhere says whether a live process other than this one holds the
// directory of trees dir (holdTrees). In this process, a state directory
// its own drivers no longer see is gone.
func heldElsewhere(dir string) bool {
	if _, ok := heldTrees.Load(dir); ok {
		return false
	}
	f, err := os.Open(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	// Closing the file lets go of the lock, if it was had.
	defer f.Close()
	return errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
}

// letGo drops this process's hold on the directory of trees dir.
func letGo(dir string) {
	if f, ok := heldTrees.LoadAndDelete(dir); ok {
		f.(*os.File).Close()
	}
}
