package execapi

import (
	"encoding/json"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
)

// Refusal reasons: the label values of the refusals metric and the reason
// logged with each refused request.
const (
	refusalUnauthenticated = "Unauthenticated"
	refusalForbidden       = "Forbidden"
	refusalCommandRefused  = v1alpha1.ReasonCommandRefused
	refusalEscape          = "PathEscape"
	refusalReadOnly        = "ReadOnly"
	refusalMountPoint      = "MountPoint"
	refusalNotReady        = "NotReady"
	refusalTooManyExecs    = "TooManyExecs"
	refusalBodyTooLarge    = "BodyTooLarge"
	refusalBadRequest      = "BadRequest"
)

// apiError is a request the server does not carry out, with the status it
// is answered with.
type apiError struct {
	code int
	// refusal, when set, counts the error as a refusal with this reason.
	refusal string
	msg     string
	// endpoint, on a request for a Sandbox of another node, is that
	// node's exec API (the claim's status.endpoint) when it has one, and
	// node that node's name, which its serving certificate must carry.
	endpoint, node string
}

func (e *apiError) Error() string { return e.msg }

// statusReason is the Kubernetes reason for an HTTP code, so that clients
// built on client-go show the familiar error kinds.
func statusReason(code int) metav1.StatusReason {
	switch code {
	case http.StatusUnauthorized:
		return metav1.StatusReasonUnauthorized
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	case http.StatusTooManyRequests:
		return metav1.StatusReasonTooManyRequests
	case http.StatusRequestEntityTooLarge:
		return metav1.StatusReasonRequestEntityTooLarge
	case http.StatusMethodNotAllowed:
		return metav1.StatusReasonMethodNotAllowed
	case http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	default:
		return metav1.StatusReasonInternalError
	}
}

// writeStatus answers with a metav1.Status, as the API server does.
func writeStatus(w http.ResponseWriter, e *apiError) {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  e.msg,
		Reason:   statusReason(e.code),
		Code:     int32(e.code),
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.code)
	_ = json.NewEncoder(w).Encode(st)
}

// refuse answers e, and when it is a refusal logs it with the caller and
// counts it.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, u *kubeauth.User, e *apiError) {
	s.noteRefusal(r, u, e)
	writeStatus(w, e)
}

// maxLoggedField bounds each field of a refusal's log line.
const maxLoggedField = 1024

func (s *Server) noteRefusal(r *http.Request, u *kubeauth.User, e *apiError) {
	if e.refusal == "" {
		return
	}
	name := "<unauthenticated>"
	if u != nil {
		name = u.Name
	}
	s.metrics.refusals.WithLabelValues(e.refusal).Inc()
	// The path, and the message that may quote it, are the caller's: a
	// request line may be a megabyte, and every refusal is logged.
	s.log.Info("refused a request", "user", boundedbuf.Cut(name, maxLoggedField), "reason", e.refusal, "method", boundedbuf.Cut(r.Method, maxLoggedField),
		"path", boundedbuf.Cut(r.URL.Path, maxLoggedField), "message", boundedbuf.Cut(e.msg, maxLoggedField))
}
