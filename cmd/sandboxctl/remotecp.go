package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// claimPath is CLAIM:/sandbox/path, the remote form of a cp argument.
var claimPath = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?):(/.*)$`)

// remoteCopy copies one file between the local file system and a SessionClaim's
// sandbox through the exec API's file endpoints, with the kubeconfig's
// credentials.
func remoteCopy(cmd *cobra.Command, f *clusterFlags, src, dst string, stderr io.Writer) int {
	ms, md := claimPath.FindStringSubmatch(src), claimPath.FindStringSubmatch(dst)
	if (ms == nil) == (md == nil) {
		return usageError(cmd, "exactly one of source and destination must be CLAIM:/path")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if ms != nil {
		err = download(ctx, f, ms[1], ms[3], dst)
	} else {
		err = upload(ctx, f, src, md[1], md[3])
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxctl: %v\n", err)
		return exitFailed
	}
	return 0
}

func fileURL(base, ns, claim, sandboxPath string) string {
	return fmt.Sprintf("%s/namespaces/%s/sessionclaims/%s/files/%s", base,
		url.PathEscape(ns), url.PathEscape(claim), strings.TrimPrefix(path.Clean(sandboxPath), "/"))
}

func fileRequest(ctx context.Context, f *clusterFlags, claim, method, sandboxPath string, body io.Reader) (*http.Response, error) {
	cfg, ns, base, err := f.apiConfig(ctx, claim)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, fileURL(base, ns, claim, sandboxPath), body)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s in SessionClaim %s/%s: %w", method, sandboxPath, ns, claim, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		msg := strings.TrimSpace(string(b))
		var st metav1.Status
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			msg = st.Message
		}
		return nil, fmt.Errorf("%s %s in SessionClaim %s/%s: %s (%d)", method, sandboxPath, ns, claim, msg, resp.StatusCode)
	}
	return resp, nil
}

func download(ctx context.Context, f *clusterFlags, claim, sandboxPath, local string) error {
	resp, err := fileRequest(ctx, f, claim, http.MethodGet, sandboxPath, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return fmt.Errorf("copying %s:%s: it is a directory; cp copies one file", claim, sandboxPath)
	}
	if err := tooLarge(resp.ContentLength); err != nil {
		return fmt.Errorf("copying %s:%s: %w", claim, sandboxPath, err)
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(sandboxPath))
	}
	// A body shorter than its Content-Length (the stream cut, the file
	// truncated while it was sent) ends in an error, and the local file
	// stays as it was.
	if err := writeLocal(local, resp.Body); err != nil {
		return fmt.Errorf("copying %s:%s to %s: %w", claim, sandboxPath, local, err)
	}
	return nil
}

func upload(ctx context.Context, f *clusterFlags, local, claim, sandboxPath string) error {
	in, err := os.Open(local)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("copying %s: only regular files are copied", local)
	}
	if strings.HasSuffix(sandboxPath, "/") {
		sandboxPath += filepath.Base(local)
	}
	resp, err := fileRequest(ctx, f, claim, http.MethodPut, sandboxPath, in)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
