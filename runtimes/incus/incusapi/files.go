package incusapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
)

// FileInfo is what the daemon says of a file inside an instance. Uid and
// Gid are as seen inside the instance.
type FileInfo struct {
	Type string
	UID  int
	GID  int
	Mode os.FileMode
}

// maxFileSize bounds what ReadFile returns: the driver reads small
// account files, never agent data.
const maxFileSize = 8 << 20

// ReadFile reads a regular file inside an instance.
func (c *Client) ReadFile(ctx context.Context, name, path string) ([]byte, FileInfo, error) {
	r := request{method: http.MethodGet, path: instancePath(name) + "/files", query: url.Values{"path": {path}}}
	resp, cancel, err := c.send(ctx, r)
	if err != nil {
		return nil, FileInfo{}, err
	}
	defer cancel()
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		_, err := decode(r, resp, nil)
		return nil, FileInfo{}, fmt.Errorf("reading %s in instance %s: %w", path, name, err)
	}
	info, err := fileInfo(resp.Header)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("reading %s in instance %s: %w", path, name, err)
	}
	if info.Type != "file" {
		return nil, info, fmt.Errorf("reading %s in instance %s: it is a %s, not a file", path, name, info.Type)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxFileSize+1))
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("reading %s in instance %s: %w", path, name, err)
	}
	if len(b) > maxFileSize {
		return nil, FileInfo{}, fmt.Errorf("reading %s in instance %s: larger than %d bytes", path, name, maxFileSize)
	}
	return b, info, nil
}

// StatFile says what is at path inside an instance; a missing path is a
// 404 *StatusError.
func (c *Client) StatFile(ctx context.Context, name, path string) (FileInfo, error) {
	r := request{method: http.MethodHead, path: instancePath(name) + "/files", query: url.Values{"path": {path}}}
	resp, cancel, err := c.send(ctx, r)
	if err != nil {
		return FileInfo{}, err
	}
	defer cancel()
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		// A HEAD answer has no body to carry the daemon's message.
		return FileInfo{}, &StatusError{Method: r.method, Path: r.path + "?path=" + path, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
	}
	return fileInfo(resp.Header)
}

func fileInfo(h http.Header) (FileInfo, error) {
	var fi FileInfo
	var err error
	fi.Type = h.Get("X-Incus-Type")
	if fi.UID, err = strconv.Atoi(h.Get("X-Incus-Uid")); err != nil {
		return fi, fmt.Errorf("bad X-Incus-Uid %q", h.Get("X-Incus-Uid"))
	}
	if fi.GID, err = strconv.Atoi(h.Get("X-Incus-Gid")); err != nil {
		return fi, fmt.Errorf("bad X-Incus-Gid %q", h.Get("X-Incus-Gid"))
	}
	mode, err := strconv.ParseUint(h.Get("X-Incus-Mode"), 8, 32)
	if err != nil {
		return fi, fmt.Errorf("bad X-Incus-Mode %q", h.Get("X-Incus-Mode"))
	}
	fi.Mode = os.FileMode(mode)
	return fi, nil
}

// WriteFile writes a regular file inside an instance, replacing it, with
// the owner and mode given (as seen inside the instance).
func (c *Client) WriteFile(ctx context.Context, name, path string, data []byte, uid, gid int, mode os.FileMode) error {
	return c.push(ctx, name, path, "file", data, uid, gid, mode)
}

// MakeDir makes a directory inside an instance; an existing one is kept.
func (c *Client) MakeDir(ctx context.Context, name, path string, uid, gid int, mode os.FileMode) error {
	return c.push(ctx, name, path, "directory", nil, uid, gid, mode)
}

func (c *Client) push(ctx context.Context, name, path, typ string, data []byte, uid, gid int, mode os.FileMode) error {
	h := http.Header{}
	h.Set("X-Incus-Type", typ)
	h.Set("X-Incus-Uid", strconv.Itoa(uid))
	h.Set("X-Incus-Gid", strconv.Itoa(gid))
	h.Set("X-Incus-Mode", fmt.Sprintf("%04o", mode.Perm()))
	h.Set("X-Incus-Write", "overwrite")
	// Without this content type the daemon writes an empty file and still
	// answers 200.
	_, err := c.do(ctx, request{
		method:      http.MethodPost,
		path:        instancePath(name) + "/files",
		query:       url.Values{"path": {path}},
		raw:         bytes.NewReader(data),
		contentType: "application/octet-stream",
		header:      h,
	}, nil)
	if err != nil {
		return fmt.Errorf("writing %s in instance %s: %w", path, name, err)
	}
	return nil
}
