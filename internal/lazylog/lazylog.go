// Package lazylog keeps a logger's fields unencoded until it writes.
//
// controller-runtime gives every pass of a reconciler a logger of its
// own, with the controller, the object and a new reconcile ID as fields.
// zap encodes the fields of a With at once, into a copy of the encoder,
// so every pass paid for encoding five fields (the object reference
// through encoding/json) that were written only when the pass logged,
// which at the default level (errors) is almost never: 1.7% of the
// controller's CPU with 1,000 Sandboxes starting. A core wrapped here
// keeps the fields of its Withs as they were given and encodes them the
// first time an entry it is enabled for is logged.
//
// A field is encoded when it is written, not when it was added: a field
// holding a pointer to something that changes in between is written as it
// is then. The controller's loggers are given values (names, IDs, object
// references by value), so their output is unchanged.
package lazylog

import (
	"sync"

	"go.uber.org/zap/zapcore"
)

// Wrap returns c with its Withs kept unencoded until an entry is logged.
func Wrap(c zapcore.Core) zapcore.Core {
	return &core{base: c}
}

// core is base with fields added by With and not yet given to it.
type core struct {
	base   zapcore.Core
	fields []zapcore.Field

	once  sync.Once
	built zapcore.Core // base.With(fields), made once when first needed
}

func (c *core) Enabled(l zapcore.Level) bool { return c.base.Enabled(l) }

// Level is base's, for zapcore.LevelOf.
func (c *core) Level() zapcore.Level { return zapcore.LevelOf(c.base) }

// With keeps fields beside the ones this core holds; base sees none of
// them yet. The slice is copied: the caller may reuse its own.
func (c *core) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	all := make([]zapcore.Field, 0, len(c.fields)+len(fields))
	all = append(append(all, c.fields...), fields...)
	return &core{base: c.base, fields: all}
}

// encoded is base with this core's fields, encoded the first time it is
// asked for.
func (c *core) encoded() zapcore.Core {
	c.once.Do(func() {
		c.built = c.base
		if len(c.fields) > 0 {
			c.built = c.base.With(c.fields)
		}
	})
	return c.built
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.base.Enabled(e.Level) {
		return ce
	}
	return c.encoded().Check(e, ce)
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.encoded().Write(e, fields)
}

func (c *core) Sync() error { return c.base.Sync() }
