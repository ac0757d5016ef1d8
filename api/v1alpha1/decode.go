package v1alpha1

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// A Sandbox whose spec or status Go cannot decode (a CRD installed without
// its admission rules lets in idleTimeout: banana) must not take every other
// Sandbox with it: client-go decodes a list as a whole, so one such item
// fails the informer's list, the cache never syncs and no Sandbox in any
// namespace is reconciled. SandboxSpec and SandboxStatus therefore decode
// field by field when the whole fails: the fields that decode are kept, the
// others are left at their zero value and recorded. ValidateSandboxSpec
// reports a recorded spec field as InvalidSpec, so the controller runs
// nothing from such a spec, and encoding writes the recorded value back
// unchanged, so an update of the object (a finalizer) never rewrites what
// the user wrote.

// undecodedField is one field left out because Go could not decode it.
type undecodedField struct {
	name string
	raw  json.RawMessage
	err  string
}

// decodeByField decodes data (a JSON object) into out, a pointer to a
// struct without JSON methods. When the object does not decode as a whole,
// each field is decoded alone and those that fail are returned instead.
func decodeByField(data []byte, out any) ([]undecodedField, error) {
	err := kjson.UnmarshalCaseSensitivePreserveInts(data, out)
	if err == nil {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		// Not an object at all: nothing to keep field by field.
		return nil, err
	}
	reset := reflect.ValueOf(out).Elem()
	reset.Set(reflect.Zero(reset.Type()))
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	var bad []undecodedField
	for _, name := range names {
		one, err := json.Marshal(map[string]json.RawMessage{name: fields[name]})
		if err != nil {
			return nil, fmt.Errorf("re-encoding field %q: %w", name, err)
		}
		// Decode into a scratch value first: a field that fails halfway
		// must not leave half a value behind.
		scratch := reflect.New(reset.Type())
		if err := kjson.UnmarshalCaseSensitivePreserveInts(one, scratch.Interface()); err != nil {
			bad = append(bad, undecodedField{name: name, raw: fields[name], err: err.Error()})
			continue
		}
		if err := kjson.UnmarshalCaseSensitivePreserveInts(one, out); err != nil {
			return nil, fmt.Errorf("decoding field %q: %w", name, err)
		}
	}
	return bad, nil
}

// encodeWithUndecoded encodes v and puts the undecoded fields back where
// the encoding has no value of its own for them.
func encodeWithUndecoded(v any, undecoded []undecodedField) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil || len(undecoded) == 0 {
		return data, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, fmt.Errorf("re-reading an encoded object: %w", err)
	}
	for _, u := range undecoded {
		if _, set := fields[u.name]; !set {
			fields[u.name] = u.raw
		}
	}
	return json.Marshal(fields)
}

type plainSandboxSpec SandboxSpec

// UnmarshalJSON decodes a spec field by field when it does not decode as a
// whole; see decodeByField.
func (s *SandboxSpec) UnmarshalJSON(data []byte) error {
	var p plainSandboxSpec
	bad, err := decodeByField(data, &p)
	if err != nil {
		return err
	}
	*s = SandboxSpec(p)
	s.undecoded = bad
	return nil
}

// MarshalJSON encodes a spec with its undecoded fields as they were read.
func (s SandboxSpec) MarshalJSON() ([]byte, error) {
	return encodeWithUndecoded(plainSandboxSpec(s), s.undecoded)
}

type plainSandboxStatus SandboxStatus

// UnmarshalJSON decodes a status field by field when it does not decode as
// a whole. The controller computes the status again, so what did not
// decode is dropped.
func (s *SandboxStatus) UnmarshalJSON(data []byte) error {
	var p plainSandboxStatus
	if _, err := decodeByField(data, &p); err != nil {
		return err
	}
	*s = SandboxStatus(p)
	return nil
}

// UndecodedFields are the spec's fields Go could not decode, each with the
// rule it breaks: the rule's message where the field has one, else the
// decoder's error.
func (s *SandboxSpec) UndecodedFields() field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")
	for _, u := range s.undecoded {
		var value any = string(u.raw)
		var str string
		if json.Unmarshal(u.raw, &str) == nil {
			value = str
		}
		msg := fmt.Sprintf("the controller cannot decode this value (%s); the CRD installed lacks the admission rule that refuses it",
			strings.TrimPrefix(u.err, "json: "))
		if u.name == "idleTimeout" {
			if m := CheckDurationString(str); m != "" {
				msg = m
			}
		}
		errs = append(errs, field.Invalid(p.Child(u.name), value, msg))
	}
	return errs
}

// DeepCopyInto copies u into out; the generated SandboxSpec copy calls it.
func (u *undecodedField) DeepCopyInto(out *undecodedField) {
	*out = *u
	out.raw = slices.Clone(u.raw)
}
