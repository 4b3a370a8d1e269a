package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandboxd/sandboxd/httpapi"
)

// filesPath is the files URL of a workspace path ("" or "." is the root).
func filesPath(id, p string) []string {
	p = strings.Trim(p, "/")
	if p == "." {
		p = ""
	}
	return sessionPath(id, append([]string{"files"}, strings.Split(p, "/")...)...)
}

// CopyToSessionOptions is an upload.
type CopyToSessionOptions struct {
	// Path is the workspace directory the archive is extracted into
	// (created when missing); "" is the root.
	Path string
	// Content is a tar stream: directories, regular files, symbolic links.
	Content io.Reader
	// Baseline takes a new diff baseline just after the upload, as
	// SessionBaseline does, with no other change between the two: the
	// result's Baseline describes it.
	Baseline bool
}

// CopyToSessionResult counts what was written.
type CopyToSessionResult struct {
	httpapi.TransferResult
}

// CopyToSession extracts a tar stream into a session's workspace (PUT
// /v1/sessions/ID/files/PATH). The daemon judges the whole stream first:
// an absolute name, "..", a link leading out, a device, or more than its
// transfer cap (ErrTooLarge) refuses it with nothing written.
func (c *Client) CopyToSession(ctx context.Context, id string, opts CopyToSessionOptions) (CopyToSessionResult, error) {
	var res CopyToSessionResult
	r := request{method: http.MethodPut, path: filesPath(id, opts.Path), body: opts.Content,
		header: http.Header{"Content-Type": {"application/x-tar"}}}
	if opts.Baseline {
		r.query = url.Values{"baseline": {"true"}}
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	return res, decode(resp, &res.TransferResult)
}

// CopyFromSessionOptions is a download.
type CopyFromSessionOptions struct {
	// Path is the workspace file or directory; "" is the root.
	Path string
}

// CopyFromSessionResult is a download's tar stream: a directory's entries
// named relative to it, a file by its base name. The caller closes
// Content. A stream the daemon had to cut short fails as it is read,
// never ending like a whole one.
type CopyFromSessionResult struct {
	Content io.ReadCloser
}

// CopyFromSession downloads a file or directory of a session's workspace
// as a tar stream (GET /v1/sessions/ID/files/PATH).
func (c *Client) CopyFromSession(ctx context.Context, id string, opts CopyFromSessionOptions) (CopyFromSessionResult, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: filesPath(id, opts.Path)})
	if err != nil {
		return CopyFromSessionResult{}, err
	}
	return CopyFromSessionResult{Content: resp.Body}, nil
}
