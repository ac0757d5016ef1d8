// Package osthread runs work on an operating system thread that may be
// changed for good (its namespaces, its file system state) and is then
// thrown away.
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Disposable calls fn on a goroutine locked to a thread that ends with
// it, and returns what fn returns. The thread is never the process's main
// thread: that one cannot end (Go parks it for good instead), and it is
// the thread /proc/self shows, so a namespace left on it would be what
// every later read of /proc/self/mountinfo, /proc/self/net and the like
// sees.
func Disposable(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Held by this goroutine meanwhile, the main thread runs
			// nothing else, so fn's goroutine lands on another.
			err := Disposable(fn)
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		// Never unlocked: the thread ends with this goroutine.
		ch <- fn()
	}()
	return <-ch
}
