//go:build linux

package areas

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// As returns r acting as id: every access below the root runs on a locked
// thread whose file-system ids are id's, with no supplementary groups and
// so without root's file capabilities (the kernel drops them when the
// file-system uid leaves 0). A resolution mistake then still meets the
// host's permissions: a root-only file is unreadable through r. Only
// opening the root itself, from its anchor, runs as the controller. When
// the process is not root, or id is 0, r is returned as it is: the process
// cannot take another identity, and acts as itself.
func (r *Root) As(id Identity) *Root {
	if id.UID == 0 || os.Geteuid() != 0 {
		return r
	}
	c := *r
	c.as = &id
	return &c
}

// ErrIdentity is wrapped when a thread could not take or give back the
// agent's file-system ids; nothing was accessed.
var ErrIdentity = errors.New("the controller could not act as the agent")

// act runs fn as r's identity, if it has one.
func (r *Root) act(fn func() error) error {
	if r.as == nil {
		return fn()
	}
	if uid, _ := unix.SetfsuidRetUid(-1); uid != os.Geteuid() {
		// Already acting as an agent: this goroutine holds a locked
		// thread inside an act (Abort from within Commit, say).
		return fn()
	}
	runtime.LockOSThread()
	groups, err := unix.Getgroups()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("%w: reading the thread's groups: %w", ErrIdentity, err)
	}
	if err := becomeAgent(*r.as); err != nil {
		if becomeController(groups) == nil {
			runtime.UnlockOSThread()
		}
		return err
	}
	ferr := fn()
	if err := becomeController(groups); err != nil {
		// The thread stays locked and ends with its goroutine: it never
		// serves anyone else with ids it could not give back.
		return err
	}
	runtime.UnlockOSThread()
	return ferr
}

// asController runs fn with the controller's file-system ids when the
// thread currently acts as an agent (inside act), for the steps that are
// the controller's own: reaching a root from its anchor.
func asController(fn func() error) error {
	uid, _ := unix.SetfsuidRetUid(-1)
	if uid == 0 || os.Geteuid() != 0 {
		return fn()
	}
	gid, _ := unix.SetfsgidRetGid(-1)
	if err := becomeController(nil); err != nil {
		return err
	}
	ferr := fn()
	if err := becomeAgent(Identity{UID: uint32(uid), GID: uint32(gid)}); err != nil {
		return err
	}
	return ferr
}

// becomeAgent sets the calling thread's supplementary groups to none and
// its file-system ids to id's, and checks that they took.
func becomeAgent(id Identity) error {
	if err := unix.Setgroups(nil); err != nil {
		return fmt.Errorf("%w: dropping the thread's groups: %w", ErrIdentity, err)
	}
	// setfsuid and setfsgid report no error, only the previous id; the
	// reads below say whether they took.
	_, _ = unix.SetfsgidRetGid(int(id.GID))
	_, _ = unix.SetfsuidRetUid(int(id.UID))
	if uid, _ := unix.SetfsuidRetUid(-1); uid != int(id.UID) {
		return fmt.Errorf("%w: the file-system uid is %d, not %d", ErrIdentity, uid, id.UID)
	}
	if gid, _ := unix.SetfsgidRetGid(-1); gid != int(id.GID) {
		return fmt.Errorf("%w: the file-system gid is %d, not %d", ErrIdentity, gid, id.GID)
	}
	return nil
}

// becomeController gives the thread back the process's ids and groups.
func becomeController(groups []int) error {
	_, _ = unix.SetfsuidRetUid(os.Geteuid())
	_, _ = unix.SetfsgidRetGid(os.Getegid())
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("%w: restoring the thread's groups: %w", ErrIdentity, err)
	}
	if uid, _ := unix.SetfsuidRetUid(-1); uid != os.Geteuid() {
		return fmt.Errorf("%w: the file-system uid stayed %d", ErrIdentity, uid)
	}
	if gid, _ := unix.SetfsgidRetGid(-1); gid != os.Getegid() {
		return fmt.Errorf("%w: the file-system gid stayed %d", ErrIdentity, gid)
	}
	return nil
}
