// Package sandboxtoml reads sandbox.toml, the standalone form of a
// Sandbox: it decodes the file into the API types, applies the same
// admission rules with the same messages as the CRD, watches the file for
// live reload, converts it to a Sandbox manifest, and runs commands with
// whatever configuration is current.
//
// It must never invent a rule of its own (every rule comes from
// api/v1alpha1 and the backend registry, bridge/backend), never accept a
// key it does not know, and never replace a good configuration with a
// broken one: an invalid edit keeps the last good configuration, so a typo
// can never turn the sandbox off.
package sandboxtoml

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/backend"
	"github.com/cireilclaw/sandbox-controller/internal/pattern"
)

// file is sandbox.toml as written. Every key the file may hold is a toml
// tag here; knownKeys is derived from it.
type file struct {
	Backend    string          `toml:"backend"`
	Mounts     []fileMount     `toml:"mounts"`
	Bwrap      fileBwrap       `toml:"bwrap"`
	Devices    fileDevices     `toml:"devices"`
	Env        fileEnv         `toml:"env"`
	Incus      *fileIncus      `toml:"incus"`
	Containerd *fileContainerd `toml:"containerd"`
	// Limits is beyond the seed: the Sandbox's spec.resources limits, in
	// the same units.
	Limits *fileLimits `toml:"limits"`
	// Network is beyond the seed: the Sandbox's spec.network, egress
	// None (the default) or Allowlist with [[network.allow]] entries.
	Network *fileNetwork `toml:"network"`
}

// fileNetwork is [network].
type fileNetwork struct {
	Egress string           `toml:"egress"`
	Allow  []fileEgressRule `toml:"allow"`
}

// fileEgressRule is one [[network.allow]]: a host and its ports.
type fileEgressRule struct {
	Host  string  `toml:"host"`
	Ports []int32 `toml:"ports"`
}

// fileLimits are [limits]: cpu ("500m", "2") and memory ("256Mi") as
// quantities, pids as a number.
type fileLimits struct {
	CPU    string `toml:"cpu"`
	Memory string `toml:"memory"`
	Pids   *int64 `toml:"pids"`
}

type fileMount struct {
	Source string `toml:"source"`
	Target string `toml:"target"`
	Mode   string `toml:"mode"`
	// SizeLimit is a quantity ("512Mi") for an overlay mount's upper layer.
	SizeLimit string `toml:"sizeLimit"`
}

type fileBwrap struct {
	Binaries []string `toml:"binaries"`
}

type fileDevices struct {
	USB bool `toml:"usb"`
	All bool `toml:"all"`
}

type fileEnv struct {
	Passthrough []string `toml:"passthrough"`
}

type fileIncus struct {
	Image          string   `toml:"image"`
	Profiles       []string `toml:"profiles"`
	Project        string   `toml:"project"`
	ShutdownOnExit *bool    `toml:"shutdownOnExit"`
}

type fileContainerd struct {
	Image string `toml:"image"`
}

// knownKeys are the dotted key paths sandbox.toml may hold, exactly as
// spelled: the decoder matches field names case-insensitively, and a
// "Backend" the user meant as "backend" must be reported, not guessed.
var knownKeys = func() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			k := prefix + f.Tag.Get("toml")
			keys[k] = true
			walk(k+".", f.Type)
		}
	}
	walk("", reflect.TypeFor[file]())
	return keys
}()

// Error is one problem in a sandbox.toml, located as precisely as the file
// allows.
type Error struct {
	// File is the path of the file as given.
	File string
	// Line and Column are 1-based; 0 when the problem has no single place
	// (the agent name comes from the command line, not the file).
	Line, Column int
	// Key is the dotted key with array indexes, "mounts[1].target".
	Key string
	// Message says what is wrong; for rule violations it is the API's
	// message, word for word.
	Message string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Default is the configuration when there is no sandbox.toml: the default
// backend, no mounts, no binaries.
func Default(agent string) *v1alpha1.SandboxSpec {
	return &v1alpha1.SandboxSpec{Agent: agent, Backend: v1alpha1.BackendBwrap}
}

// Load reads the sandbox.toml at path for an agent. A missing file is the
// default configuration; anything unreadable, malformed or breaking a rule
// is an error.
func Load(path, agent string) (*v1alpha1.SandboxSpec, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		spec := Default(agent)
		if err := validate(path, spec, nil); err != nil {
			return nil, err
		}
		return spec, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading sandbox configuration: %w", err)
	}
	return Parse(path, data, agent)
}

// Parse decodes the contents of a sandbox.toml; name is used in errors.
// All problems are reported together, each an *Error (errors.Join).
func Parse(name string, data []byte, agent string) (*v1alpha1.SandboxSpec, error) {
	var f file
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&f)
	if err != nil {
		return nil, decodeError(name, data, err)
	}
	loc := newLocator(md, data)
	var errs []error
	reported := map[string]bool{}
	for _, k := range md.Keys() {
		ks := k.String()
		if knownKeys[ks] || reported[parentReported(reported, k)] {
			continue
		}
		reported[ks] = true
		e := &Error{File: name, Key: ks, Message: unknownKeyMessage(k)}
		e.Line, e.Column = loc.position(k, -1)
		errs = append(errs, e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	spec, fieldErrs := toSpec(f, agent)
	if len(fieldErrs) > 0 {
		for _, fe := range fieldErrs {
			errs = append(errs, tomlError(name, fe, loc))
		}
		return nil, errors.Join(errs...)
	}
	if err := validate(name, spec, loc); err != nil {
		return nil, err
	}
	return spec, nil
}

// parentReported returns the already reported key k is below, so that an
// unknown table is one error rather than one per key inside it.
func parentReported(reported map[string]bool, k toml.Key) string {
	for i := 1; i < len(k); i++ {
		if p := k[:i].String(); reported[p] {
			return p
		}
	}
	return "\x00"
}

func unknownKeyMessage(k toml.Key) string {
	var near []string
	want := strings.ToLower(k.String())
	for known := range knownKeys {
		if strings.ToLower(known) == want {
			near = append(near, known)
		}
	}
	if len(near) > 0 {
		return fmt.Sprintf("unknown key %q (keys are case-sensitive: did you mean %q?)", k.String(), near[0])
	}
	keys := make([]string, 0, len(knownKeys))
	for known := range knownKeys {
		keys = append(keys, known)
	}
	slices.Sort(keys)
	return fmt.Sprintf("unknown key %q; known keys are %s", k.String(), strings.Join(keys, ", "))
}

// decodeError turns the decoder's error into an *Error with the position
// the decoder knows.
func decodeError(name string, data []byte, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		line, col := lineColumn(data, pe.Position.Start)
		return &Error{File: name, Line: line, Column: col, Key: pe.LastKey, Message: pe.Message}
	}
	// Type mismatches carry only a line, inside the message.
	msg := err.Error()
	e := &Error{File: name, Message: strings.TrimPrefix(msg, "toml: ")}
	if m := typeErrorPattern().FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Key = m[2]
		e.Message = m[3]
	}
	return e
}

var typeErrorPattern = pattern.Lazy(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)

// toSpec turns the file into a spec; the errors are values that do not
// parse (a size that is not a quantity), before any rule is applied.
func toSpec(f file, agent string) (*v1alpha1.SandboxSpec, field.ErrorList) {
	var errs field.ErrorList
	spec := &v1alpha1.SandboxSpec{
		Agent:   agent,
		Backend: v1alpha1.Backend(f.Backend),
		Devices: v1alpha1.Devices{USB: f.Devices.USB, All: f.Devices.All},
	}
	if spec.Backend == "" {
		spec.Backend = v1alpha1.BackendBwrap
	}
	for i, m := range f.Mounts {
		mode := v1alpha1.MountMode(m.Mode)
		if mode == "" {
			mode = v1alpha1.MountReadOnly
		}
		mount := v1alpha1.Mount{Source: m.Source, Target: m.Target, Mode: mode}
		if m.SizeLimit != "" {
			q, err := resource.ParseQuantity(m.SizeLimit)
			if err != nil {
				errs = append(errs, field.Invalid(field.NewPath("spec", "mounts").Index(i).Child("sizeLimit"), m.SizeLimit,
					"must be a size such as 512Mi or 2Gi"))
			} else {
				mount.SizeLimit = &q
			}
		}
		spec.Mounts = append(spec.Mounts, mount)
	}
	for _, b := range f.Bwrap.Binaries {
		spec.Binaries = append(spec.Binaries, v1alpha1.BinaryName(b))
	}
	for _, n := range f.Env.Passthrough {
		spec.Env.Passthrough = append(spec.Env.Passthrough, v1alpha1.EnvVarName(n))
	}
	if f.Incus != nil {
		spec.Incus = &v1alpha1.IncusSpec{Image: f.Incus.Image, Profiles: f.Incus.Profiles, Project: f.Incus.Project, ShutdownOnExit: f.Incus.ShutdownOnExit}
	}
	if f.Containerd != nil {
		spec.Containerd = &v1alpha1.ContainerdSpec{Image: f.Containerd.Image}
	}
	if n := f.Network; n != nil {
		spec.Network = &v1alpha1.Network{Egress: v1alpha1.EgressMode(n.Egress)}
		if spec.Network.Egress == "" {
			spec.Network.Egress = v1alpha1.EgressNone
		}
		for _, r := range n.Allow {
			spec.Network.Allow = append(spec.Network.Allow, v1alpha1.EgressRule{Host: r.Host, Ports: r.Ports})
		}
	}
	if l := f.Limits; l != nil {
		spec.Resources = &v1alpha1.Resources{PidsLimit: l.Pids}
		for _, q := range []struct {
			key, value string
			into       **resource.Quantity
		}{{"cpu", l.CPU, &spec.Resources.Limits.CPU}, {"memory", l.Memory, &spec.Resources.Limits.Memory}} {
			if q.value == "" {
				continue
			}
			v, err := resource.ParseQuantity(q.value)
			if err != nil {
				errs = append(errs, field.Invalid(field.NewPath("spec", "resources", "limits", q.key), q.value,
					"must be a quantity such as 500m or 2 (cpu), 256Mi or 1Gi (memory)"))
				continue
			}
			*q.into = &v
		}
	}
	return spec, errs
}

// specToKey maps the API's field paths onto sandbox.toml's keys where the
// two differ.
var specToKey = map[string]string{"binaries": "bwrap.binaries", "agent": "agent (from the command line)"}

// validate applies backend.ValidateSpec, the one table of rules (the API's
// and the backend's), and re-labels its errors with sandbox.toml's keys and
// positions.
func validate(name string, spec *v1alpha1.SandboxSpec, loc *locator) error {
	fieldErrs := backend.ValidateSpec(spec)
	if len(fieldErrs) == 0 {
		return nil
	}
	errs := make([]error, 0, len(fieldErrs))
	for _, fe := range fieldErrs {
		errs = append(errs, tomlError(name, fe, loc))
	}
	return errors.Join(errs...)
}

var indexPattern = pattern.Lazy(`\[(\d+)\]`)

func tomlError(name string, fe *field.Error, loc *locator) *Error {
	path := strings.TrimPrefix(fe.Field, "spec.")
	top, rest, _ := strings.Cut(path, ".")
	topName, topIndex, _ := strings.Cut(top, "[")
	if k, ok := specToKey[topName]; ok {
		path = k
		if topIndex != "" {
			path += "[" + topIndex
		}
		if rest != "" {
			path += "." + rest
		}
	}
	if rest, ok := strings.CutPrefix(path, "resources.limits."); ok {
		path = "limits." + rest
	} else if path == "resources.pidsLimit" {
		path = "limits.pids"
	}
	msg := fe.Detail
	switch fe.Type {
	case field.ErrorTypeInvalid, field.ErrorTypeNotSupported:
		msg = fmt.Sprintf("%v: %s", fe.BadValue, fe.Detail)
		if s, ok := fe.BadValue.(string); ok {
			msg = fmt.Sprintf("%q: %s", s, fe.Detail)
		}
	}
	e := &Error{File: name, Key: path, Message: msg}
	if loc != nil && topName != "agent" {
		index := -1
		if m := indexPattern().FindStringSubmatch(path); m != nil {
			index, _ = strconv.Atoi(m[1])
		}
		key := toml.Key(strings.Split(indexPattern().ReplaceAllString(path, ""), "."))
		e.Line, e.Column = loc.position(key, index)
	}
	return e
}
