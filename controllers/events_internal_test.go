package controllers

import (
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/client-go/tools/record"
)

// Every Event's message is cut as a condition's is, at a character
// boundary, however it is recorded.
func TestEventMessagesAreBounded(t *testing.T) {
	fake := record.NewFakeRecorder(3)
	r := bounded(fake)
	long := strings.Repeat("é", 4000)
	r.Event(nil, "Warning", "Long", long)
	r.Eventf(nil, "Warning", "Long", "kept: %s", long)
	r.AnnotatedEventf(nil, map[string]string{"a": "b"}, "Warning", "Long", "kept: %s", long)
	for range 3 {
		got := <-fake.Events
		// The fake recorder writes an Event's annotations after it.
		msg := strings.TrimSuffix(strings.TrimPrefix(got, "Warning Long "), " map[a:b]")
		if len(msg) > maxConditionMessage+len("…") || !utf8.ValidString(msg) {
			t.Errorf("an Event of %d bytes (valid UTF-8: %v)", len(msg), utf8.ValidString(msg))
		}
	}
	r.Eventf(nil, "Normal", "Short", "%d%%", 5)
	if got := <-fake.Events; got != "Normal Short 5%" {
		t.Errorf("a short message became %q", got)
	}
}
