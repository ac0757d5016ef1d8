package execapi

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// hideFailure is what a caller is told of err, a failure of the runtime
// or of the server itself that is no refusal: what failed, its reason
// and an id, under which the node's log has err. Such an error comes
// from code that works with host paths (the instance's record and mount
// tree, the runtime's state, its daemon's files), and its words are the
// node's, not the sandbox's.
func (s *Server) hideFailure(what, claim string, err error) string {
	id := failureID()
	s.log.Info(what+" failed", "claim", claim, "failure", id, "error", err.Error())
	return fmt.Sprintf("%s failed (%s); the node's log has why, under failure %s", what, instance.ErrorReason(err), id)
}

// hiddenRuntimeError is err as a caller sees it: a refusal (the policy's
// words) as it is, any other failure by hideFailure, with its reason.
func (s *Server) hiddenRuntimeError(what, claim, name string, err error) error {
	if err == nil || runtimes.ReasonOf(err) == runtimes.ReasonRefused {
		return err
	}
	return &runtimes.Error{Reason: runtimes.ReasonOf(err), Op: what, Name: name, Err: hiddenError(s.hideFailure(what, claim, err))}
}

// hiddenError is a failure's message as hideFailure gave it.
type hiddenError string

func (e hiddenError) Error() string { return string(e) }

// failureID names one failure in the node's log.
func failureID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
