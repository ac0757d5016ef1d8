package main

import (
	"bytes"
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"

	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
)

func TestLoggerDefaults(t *testing.T) {
	for _, tc := range []struct {
		name, format, level string
		wantJSON            bool
		wantV1, wantV4      bool
	}{
		{name: "production default is JSON at info", format: "json", level: "info", wantJSON: true},
		{name: "make run is console at debug", format: "console", level: "debug", wantV1: true},
		{name: "verbosity 4 shows steady-state lines", format: "json", level: "4", wantJSON: true, wantV1: true, wantV4: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := loggerOptions(tc.format, tc.level)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log := zap.New(append(opts, zap.WriteTo(&buf))...)
			log.Info("info line")
			log.V(1).Info("v1 line")
			log.V(4).Info("v4 line")
			out := buf.String()
			first, _, _ := strings.Cut(out, "\n")
			var obj map[string]any
			isJSON := json.Unmarshal([]byte(first), &obj) == nil
			if isJSON != tc.wantJSON {
				t.Errorf("first line %q: JSON %v, want %v", first, isJSON, tc.wantJSON)
			}
			if isJSON && obj["level"] != "info" {
				t.Errorf("first line %q: level %v, want info", first, obj["level"])
			}
			if !strings.Contains(out, "info line") {
				t.Errorf("info line missing from %q", out)
			}
			if got := strings.Contains(out, "v1 line"); got != tc.wantV1 {
				t.Errorf("V(1) line written: %v, want %v (output %q)", got, tc.wantV1, out)
			}
			if got := strings.Contains(out, "v4 line"); got != tc.wantV4 {
				t.Errorf("V(4) line written: %v, want %v (output %q)", got, tc.wantV4, out)
			}
		})
	}
}

// encodings counts how often a log field is encoded.
type encodings int

func (n *encodings) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	*n++
	enc.AddString("name", "agent-1")
	return nil
}

// A pass's logger carries the object and a reconcile ID; a pass that logs
// nothing at the level does not encode them.
func TestLoggerEncodesFieldsOnlyToWrite(t *testing.T) {
	opts, err := loggerOptions("json", "info")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var n encodings
	log := zap.New(append(opts, zap.WriteTo(&buf))...).WithValues("controller", "sandbox").WithValues("Sandbox", &n, "reconcileID", "1")
	log.V(1).Info("below the level")
	if n != 0 {
		t.Fatalf("the fields were encoded %d times before anything was written", n)
	}
	log.Info("written")
	if n != 1 || !strings.Contains(buf.String(), `"Sandbox":{"name":"agent-1"},"reconcileID":"1"`) {
		t.Fatalf("fields encoded %d times; output %q", n, buf.String())
	}
}

func TestLoggerFlagsRefused(t *testing.T) {
	for _, tc := range []struct{ name, format, level, want string }{
		{name: "unknown format", format: "xml", level: "info", want: "--log-format"},
		{name: "unknown level", format: "json", level: "loud", want: "--log-level"},
		{name: "negative verbosity", format: "json", level: "-1", want: "--log-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loggerOptions(tc.format, tc.level)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("loggerOptions(%q, %q) = %v, want an error naming %s", tc.format, tc.level, err, tc.want)
			}
		})
	}
}

// The cache keeps no managed fields: they are most of a small object's
// size and the controller never reads them.
func TestCacheDropsManagedFields(t *testing.T) {
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{
		Name:          "alice",
		Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
	}}
	transform := cacheOptions(&rest.Config{Host: "https://127.0.0.1:1"}).DefaultTransform
	if transform == nil {
		t.Fatal("the cache has no default transform")
	}
	out, err := transform(sb)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1alpha1.Sandbox)
	if len(got.ManagedFields) != 0 {
		t.Errorf("managed fields kept in the cache: %v", got.ManagedFields)
	}
	if _, ok := got.Annotations["kubectl.kubernetes.io/last-applied-configuration"]; !ok {
		t.Error("last-applied-configuration dropped: an Update from the cache would remove it from the server")
	}
}

func TestPlacementFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		lostAfter time.Duration
		image     string
		want      string
	}{
		{0, "pause", "--node-lost-after=0s"},
		{-time.Second, "pause", "--node-lost-after=-1s"},
		{500 * time.Millisecond, "pause", "--node-lost-after=500ms"},
		{time.Minute, "", "--sandbox-pod-image"},
	} {
		err := checkPlacementFlags(tc.lostAfter, tc.image)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("checkPlacementFlags(%s, %q) = %v, want an error naming %s", tc.lostAfter, tc.image, err, tc.want)
		}
	}
	if err := checkPlacementFlags(40*time.Second, "registry.k8s.io/pause:3.10"); err != nil {
		t.Errorf("the defaults refused: %v", err)
	}
}

func TestEgressFlagsRefused(t *testing.T) {
	ok := egressFlags{maxConns: 256, idleTimeout: 5 * time.Minute}
	if err := ok.check(); err != nil {
		t.Errorf("the defaults refused: %v", err)
	}
	for _, tc := range []struct {
		mut  func(*egressFlags)
		want string
	}{
		{func(e *egressFlags) { e.maxConns = 0 }, "--egress-max-connections=0"},
		{func(e *egressFlags) { e.maxConnsTotal = -1 }, "--egress-max-connections-total=-1"},
		{func(e *egressFlags) { e.idleTimeout = time.Millisecond }, "--egress-idle-timeout=1ms"},
		{func(e *egressFlags) { e.bytesPerSecond = resource.MustParse("100") }, "--egress-bandwidth=100"},
		{func(e *egressFlags) { e.internalNets = "10.96.0.0/12, 11.0.0.0" }, `--egress-internal-networks: "11.0.0.0"`},
	} {
		e := ok
		tc.mut(&e)
		if err := e.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check() = %v, want an error naming %s", err, tc.want)
		}
	}
	e := ok
	e.internalNets = "11.96.0.0/12,fd00:10::/108"
	if nets, err := e.internal(); err != nil || len(nets) != 2 {
		t.Errorf("internal() = %v, %v", nets, err)
	}
}

func TestGCPercent(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	for _, bad := range []int{0, -2} {
		if err := setGCPercent(bad, ""); err == nil || !strings.Contains(err.Error(), "--gc-percent") {
			t.Errorf("--gc-percent=%d: %v, want a refusal naming the flag", bad, err)
		}
	}
	if err := setGCPercent(50, ""); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 50 {
		t.Fatalf("the target is %d after --gc-percent=50", got)
	}
	// GOGC set: the environment wins, the flag changes nothing.
	if err := setGCPercent(50, "200"); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("the target is %d with GOGC set, want it left alone", got)
	}
}
