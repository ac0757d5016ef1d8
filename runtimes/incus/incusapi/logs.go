package incusapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// maxLogSize bounds what InstanceLog returns: the driver only looks for a
// known line in the log of a start.
const maxLogSize = 1 << 20

// InstanceLog reads one of an instance's log files, such as lxc.log (the
// last start's), up to its first MiB.
func (c *Client) InstanceLog(ctx context.Context, name, file string) ([]byte, error) {
	r := request{method: http.MethodGet, path: instancePath(name) + "/logs/" + escape(file)}
	resp, cancel, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		_, err := decode(r, resp, nil)
		return nil, fmt.Errorf("reading log %s of instance %s: %w", file, name, err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxLogSize))
	if err != nil {
		return nil, fmt.Errorf("reading log %s of instance %s: %w", file, name, err)
	}
	return b, nil
}
