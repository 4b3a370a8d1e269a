package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sandboxd/sandboxd/runner"
)

// SessionDiffOptions says what a diff compares.
type SessionDiffOptions struct {
	// Since, when set, is a journal commit (0: the journal's start): the
	// diff is of the paths the journal's commits after it touched. Unset,
	// it is of the whole tree since the session's baseline: its start, or
	// the last SessionBaseline.
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

// SessionBaselineOptions is for SessionBaseline; it has no fields yet.
type SessionBaselineOptions struct{}

// SessionBaselineResult describes the new baseline.
type SessionBaselineResult struct {
	Baseline runner.BaselineInfo
}

// SessionBaseline takes a new diff baseline (POST /v1/sessions/ID/baseline):
// SessionDiff without Since compares with the workspace as it is now from
// then on, so what was uploaded before (the project put into an empty
// session) is not in the diff. The daemon waits for the session's calls in
// flight that may change the workspace, and holds back those that come
// meanwhile. The journal is not touched. To upload and take the baseline
// in one call, set CopyToSessionOptions.Baseline.
func (c *Client) SessionBaseline(ctx context.Context, id string, _ SessionBaselineOptions) (SessionBaselineResult, error) {
	var res SessionBaselineResult
	err := c.sendJSON(ctx, http.MethodPost, sessionPath(id, "baseline"), nil, &res.Baseline)
	return res, err
}
