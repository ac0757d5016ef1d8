package runtimes

import "context"

// Constructor builds a driver from its parsed command-line flags (each
// driver's Flags binds them). stateDir is the controller's state
// directory; a driver keeps its own below it. closeFn releases what the
// driver holds (a connection); nil when nothing.
type Constructor func(ctx context.Context, stateDir string) (rt Runtime, closeFn func(), err error)
