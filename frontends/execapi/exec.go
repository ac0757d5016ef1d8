package execapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/kubeauth"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Status reasons and causes of the remote-command protocol that client-go
// turns into an exit code.
const (
	reasonNonZeroExitCode = metav1.StatusReason("NonZeroExitCode")
	causeExitCode         = metav1.CauseType("ExitCode")
	// reasonCommandRefused marks a command the policy refused; nothing ran.
	reasonCommandRefused = metav1.StatusReason(v1alpha1.ReasonCommandRefused)
)

// execRequest is what the query of an exec request asks for.
type execRequest struct {
	argv                  []string
	stdin, stdout, stderr bool
}

func parseExecRequest(r *http.Request) (execRequest, *apiError) {
	q := r.URL.Query()
	req := execRequest{argv: q["command"], stdout: true, stderr: true}
	flags := []struct {
		name string
		to   *bool
	}{{"stdin", &req.stdin}, {"stdout", &req.stdout}, {"stderr", &req.stderr}}
	for _, f := range flags {
		if v := q.Get(f.name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return req, &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: fmt.Sprintf("query parameter %s=%q is not a boolean", f.name, v)}
			}
			*f.to = b
		}
	}
	if v := q.Get("tty"); v != "" {
		if b, _ := strconv.ParseBool(v); b {
			return req, &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: "tty=true is not supported: commands run without a terminal"}
		}
	}
	if len(req.argv) == 0 {
		return req, &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: "no command: give it as repeated command= query parameters, one argument each"}
	}
	return req, nil
}

// serveExec runs one command over the remote-command websocket protocol.
func (s *Server) serveExec(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	// The websocket handshake is a GET; POST is accepted as the API server
	// does for pods/exec.
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		writeStatus(w, &apiError{code: http.StatusMethodNotAllowed, msg: "exec takes GET or POST with a websocket upgrade"})
		return
	}
	u, how := s.authenticate(w, r)
	if u == nil || !s.authorize(w, r, u, "create", subresourceExec, ns, name) {
		return
	}
	req, aerr := parseExecRequest(r)
	if aerr != nil {
		s.refuse(w, r, u, aerr)
		return
	}
	if !wantsV5(r) {
		s.refuse(w, r, u, &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: "exec needs a websocket upgrade offering the subprotocol " + protocolV5 + " (client-go's remotecommand.NewWebSocketExecutor, kubectl sandbox exec)"})
		return
	}
	t, ok := s.claimTarget(w, r, u, how, ns, name, true)
	if !ok {
		return
	}
	key := ns + "/" + name
	if !s.execs.acquire(key) {
		s.refuse(w, r, u, &apiError{code: http.StatusTooManyRequests, refusal: refusalTooManyExecs, msg: fmt.Sprintf("SessionClaim %s already runs %d commands, the most one claim may run at once", key, s.cfg.MaxExecsPerClaim)})
		return
	}
	defer s.execs.release(key)
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		// The upgrader has answered the client.
		s.log.V(4).Info("websocket upgrade failed", "claim", key, "error", err.Error())
		return
	}
	s.runExec(r, u, t, req, conn)
}

func (s *Server) runExec(r *http.Request, u *kubeauth.User, t *target, req execRequest, conn *websocket.Conn) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ExecTimeout)
	defer cancel()

	var stdinR, stdinW *os.File
	if req.stdin {
		var err error
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			st := newStream(conn, cancel, nil)
			s.metrics.execs.WithLabelValues(outcomeFailed).Inc()
			st.finish(failure(metav1.StatusReasonInternalError, "making the stdin pipe: "+err.Error()))
			return
		}
	}
	st := newStream(conn, cancel, stdinW)

	if err := policy.CheckArgv(t.instance.Binaries, req.argv); err != nil {
		if stdinR != nil {
			stdinR.Close()
		}
		s.metrics.execs.WithLabelValues(outcomeRefused).Inc()
		s.noteRefusal(r, u, &apiError{refusal: refusalCommandRefused, msg: err.Error()})
		st.finish(failure(reasonCommandRefused, err.Error()))
		return
	}

	// The command's stdin is the read end of a pipe, an *os.File: the
	// driver hands it to the process as it is, and waiting for the process
	// never waits for a client that keeps stdin open.
	var stdin io.Reader = strings.NewReader("")
	if stdinR != nil {
		stdin = stdinR
	}
	stdout, stderr := io.Discard, io.Discard
	if req.stdout {
		stdout = st.channel(channelStdout)
	}
	if req.stderr {
		stderr = st.channel(channelStderr)
	}
	res, err := t.runtime.Exec(ctx, t.instance.Name, runtimes.ExecRequest{Argv: req.argv, Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if stdinR != nil {
		stdinR.Close()
	}
	st.closeStdin()

	status, outcome := s.execStatus(ctx, t.claim.Namespace+"/"+t.claim.Name, res, err)
	if outcome == outcomeRefused {
		s.noteRefusal(r, u, &apiError{refusal: refusalCommandRefused, msg: err.Error()})
	}
	s.metrics.execs.WithLabelValues(outcome).Inc()
	s.metrics.latency.Observe(time.Since(start).Seconds())
	st.finish(status)
}

// execStatus is the status-channel message for how a command ended.
func (s *Server) execStatus(ctx context.Context, claim string, res runtimes.ExitStatus, err error) (metav1.Status, string) {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return failure(metav1.StatusReasonTimeout, fmt.Sprintf("the command ran longer than the exec timeout (%s) and was killed", s.cfg.ExecTimeout)), outcomeFailed
	case err != nil && runtimes.ReasonOf(err) == runtimes.ReasonRefused:
		return failure(reasonCommandRefused, err.Error()), outcomeRefused
	case err != nil:
		return failure(metav1.StatusReason(instance.ErrorReason(err)), s.hideFailure("running the command", claim, err)), outcomeFailed
	case res.Code == 0:
		return metav1.Status{Status: metav1.StatusSuccess}, outcomeExited
	default:
		code := min(max(res.Code, 0), 255)
		st := failure(reasonNonZeroExitCode, fmt.Sprintf("command terminated with non-zero exit code: %d", code))
		st.Details = &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: causeExitCode, Message: strconv.Itoa(code)}}}
		return st, outcomeExited
	}
}

func failure(reason metav1.StatusReason, msg string) metav1.Status {
	return metav1.Status{Status: metav1.StatusFailure, Reason: reason, Message: msg}
}
