package incusapi

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Operation is a background task of the daemon.
type Operation struct {
	ID          string                     `json:"id"`
	Class       string                     `json:"class"`
	Description string                     `json:"description"`
	Status      string                     `json:"status"`
	StatusCode  int                        `json:"status_code"`
	Resources   map[string][]string        `json:"resources"`
	Metadata    map[string]json.RawMessage `json:"metadata"`
	MayCancel   bool                       `json:"may_cancel"`
	Err         string                     `json:"err"`
	CreatedAt   time.Time                  `json:"created_at"`
}

// Operation statuses that end it.
const (
	StatusSuccess   = "Success"
	StatusFailure   = "Failure"
	StatusCancelled = "Cancelled"
)

// Done says whether the operation has ended.
func (o *Operation) Done() bool {
	switch o.Status {
	case StatusSuccess, StatusFailure, StatusCancelled:
		return true
	}
	return false
}

// OperationError is a background operation that ended without success.
type OperationError struct {
	Description string
	Status      string
	Err         string
}

func (e *OperationError) Error() string {
	if e.Err == "" {
		return fmt.Sprintf("%s: %s", strings.ToLower(e.Description), strings.ToLower(e.Status))
	}
	return fmt.Sprintf("%s: %s", strings.ToLower(e.Description), e.Err)
}

// Wait waits for the operation at path (as the daemon returned it, e.g.
// /1.0/operations/<id>) to end, at most Options.WaitTimeout or until ctx
// ends. An operation that fails is an *OperationError; the daemon answering
// {"type":"error"} to the wait itself is a *StatusError.
func (c *Client) Wait(ctx context.Context, path string) (*Operation, error) {
	path = trimAPI(path)
	ctx, cancel := context.WithTimeout(ctx, c.opts.WaitTimeout)
	defer cancel()
	for {
		// The daemon holds the request until the operation ends or the
		// timeout it was given passes; ours is a little longer.
		wait := c.opts.RequestTimeout
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			wait = time.Until(dl)
		}
		secs := int(math.Ceil(wait.Seconds()))
		if secs < 1 {
			secs = 1
		}
		var op Operation
		reqCtx, reqCancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+c.opts.DialTimeout)
		_, err := c.do(reqCtx, request{
			method: http.MethodGet,
			path:   path + "/wait",
			query:  url.Values{"timeout": {strconv.Itoa(secs)}},
			stream: true,
		}, &op)
		reqCancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("waiting for operation %s: %w", path, ctx.Err())
			}
			return nil, err
		}
		if op.Done() {
			if op.Status != StatusSuccess {
				return &op, &OperationError{Description: op.Description, Status: op.Status, Err: op.Err}
			}
			return &op, nil
		}
		if ctx.Err() != nil {
			return &op, fmt.Errorf("waiting for operation %s (%s): %w", path, op.Description, ctx.Err())
		}
	}
}

// Cancel asks the daemon to cancel a running operation.
func (c *Client) Cancel(ctx context.Context, path string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: trimAPI(path)}, nil)
	return err
}

// secrets reads the websocket secrets of an exec operation.
func (o *Operation) secrets() (map[string]string, error) {
	raw, ok := o.Metadata["fds"]
	if !ok {
		return nil, fmt.Errorf("operation %s carries no websocket secrets", o.ID)
	}
	var fds map[string]string
	if err := json.Unmarshal(raw, &fds); err != nil {
		return nil, fmt.Errorf("operation %s: decoding websocket secrets: %w", o.ID, err)
	}
	return fds, nil
}

// returnCode reads the exit status of a finished exec operation.
func (o *Operation) returnCode() (int, bool) {
	raw, ok := o.Metadata["return"]
	if !ok {
		return 0, false
	}
	var code int
	if err := json.Unmarshal(raw, &code); err != nil {
		return 0, false
	}
	return code, true
}
