package lazylog

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// encodings counts how often it is encoded.
type encodings int

func (n *encodings) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	*n++
	enc.AddString("kind", "Sandbox")
	return nil
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time                         { return time.Time(c) }
func (c fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// logger logs errors and above as JSON to out, through Wrap when lazy.
func logger(out *bytes.Buffer, lazy bool) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	c := zapcore.NewSamplerWithOptions(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(out), zapcore.ErrorLevel), time.Second, 100, 100)
	if lazy {
		c = Wrap(c)
	}
	return zap.New(c, zap.WithClock(fixedClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))))
}

func TestFieldsAreEncodedOnlyWhenAnEntryIsWritten(t *testing.T) {
	var out bytes.Buffer
	var n encodings
	l := logger(&out, true).With(zap.Object("object", &n), zap.String("controller", "sandbox")).With(zap.String("reconcileID", "1"))
	l.Info("below the level")
	l.Debug("below the level")
	if n != 0 || out.Len() != 0 {
		t.Fatalf("fields encoded %d times and %q written before anything was logged at the level", n, out.String())
	}
	l.Error("first")
	l.Error("second")
	if n != 1 {
		t.Fatalf("fields encoded %d times for two entries; want once", n)
	}
	if got := bytes.Count(out.Bytes(), []byte(`"object":{"kind":"Sandbox"},"controller":"sandbox","reconcileID":"1"`)); got != 2 {
		t.Fatalf("%d entries carry the fields, want 2:\n%s", got, out.String())
	}
}

// A wrapped logger writes what the same logger unwrapped writes, in the
// same order, through With chains, fields of the entry itself and the
// sampler.
func TestWrappedWritesWhatUnwrappedWrites(t *testing.T) {
	run := func(lazy bool) string {
		var out bytes.Buffer
		var n encodings
		base := logger(&out, lazy)
		ctl := base.With(zap.String("controller", "sessionclaim"), zap.Object("object", &n))
		for i := range 3 {
			pass := ctl.With(zap.Int("pass", i)).With()
			pass.Info("not written")
			pass.Error("failed", zap.Error(errors.New("boom")), zap.Int("attempt", i))
		}
		base.Error("bare")
		ctl.Warn("not written either")
		for range 250 {
			ctl.Error("sampled") // the sampler keeps the first 100 of a second, then every 100th
		}
		return out.String()
	}
	eager, lazy := run(false), run(true)
	if eager != lazy {
		t.Fatalf("wrapped output differs:\nunwrapped:\n%s\nwrapped:\n%s", eager, lazy)
	}
	if n := bytes.Count([]byte(lazy), []byte("\n")); n != 3+1+100+1 {
		t.Fatalf("%d lines written, want 105 (3 failures, 1 bare, 101 sampled)", n)
	}
}

func TestLevelIsTheBases(t *testing.T) {
	var out bytes.Buffer
	if got := zapcore.LevelOf(logger(&out, true).Core()); got != zapcore.ErrorLevel {
		t.Fatalf("LevelOf = %v, want error", got)
	}
}

// passLogger is what controller-runtime does for every pass of a
// reconciler: the controller's logger with the object, then a reconcile ID.
func passLogger(ctl logr.Logger, i int) logr.Logger {
	return ctl.WithValues("SessionClaim", klog.KRef("scale", "agent-00001-session"), "namespace", "scale", "name", "agent-00001-session").
		WithValues("reconcileID", "0b7c4e8e-2f0a-4a53-9d55-6f3c1f1f6d2a")
}

// BenchmarkPassLogger is the logger a pass gets, with the controller's
// options (JSON, errors only), encoded at once as zap does and kept
// unencoded by Wrap. The pass logs nothing, as nearly every pass.
func BenchmarkPassLogger(b *testing.B) {
	for _, bc := range []struct {
		name string
		lazy bool
	}{{"zap", false}, {"lazylog", true}} {
		b.Run(bc.name, func(b *testing.B) {
			opts := []crzap.Opts{crzap.UseDevMode(false), crzap.JSONEncoder(), crzap.Level(zapcore.ErrorLevel), crzap.WriteTo(&bytes.Buffer{})}
			if bc.lazy {
				opts = append(opts, crzap.RawZapOpts(zap.WrapCore(Wrap)))
			}
			ctl := crzap.New(opts...).WithValues("controller", "sessionclaim", "controllerGroup", "sandbox.cireilclaw.dev", "controllerKind", "SessionClaim")
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				l := passLogger(ctl, i)
				l.V(1).Info("not written")
			}
		})
	}
}
