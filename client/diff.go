package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// SessionDiffOptions says what a diff compares.
type SessionDiffOptions struct {
	// Since, when set, is a journal commit (0: the journal's start): the
	// diff is of the paths the journal's commits after it touched. Unset,
	// it is of the whole tree since the session began.
	Since *int
}

// SessionDiffResult is a git-format patch, streamed: the caller closes
// Patch. It is empty when nothing changed.
type SessionDiffResult struct {
	Patch io.ReadCloser
}

// SessionDiff returns what a session changed (GET /v1/sessions/ID/diff) as
// a patch `git apply` applies to the tree it was taken from. sandboxd's
// bookkeeping (.sandboxd/) and .git are never in it. A Since the journal
// does not have is ErrNotFound.
func (c *Client) SessionDiff(ctx context.Context, id string, opts SessionDiffOptions) (SessionDiffResult, error) {
	q := url.Values{}
	if opts.Since != nil {
		q.Set("since", strconv.Itoa(*opts.Since))
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sessionPath(id, "diff"), query: q})
	if err != nil {
		return SessionDiffResult{}, err
	}
	return SessionDiffResult{Patch: resp.Body}, nil
}
