package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// boundedRecorder records Events whose messages are cut at
// maxConditionMessage, as conditions' are: a message quotes what the
// runtime, git or the API server said about an agent's files, refs and
// names, which are the agent's to make as long as it likes, and every
// Event is stored by the API server and read by whoever describes the
// object.
type boundedRecorder struct{ record.EventRecorder }

// bounded is r, its messages cut.
func bounded(r record.EventRecorder) record.EventRecorder { return boundedRecorder{r} }

func (r boundedRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.EventRecorder.Event(obj, eventtype, reason, boundedMessage(message))
}

func (r boundedRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r boundedRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, format string, args ...any) {
	r.EventRecorder.AnnotatedEventf(obj, annotations, eventtype, reason, "%s", boundedMessage(fmt.Sprintf(format, args...)))
}
