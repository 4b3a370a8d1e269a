package client

import (
	"context"
	"net/http"

	"github.com/sandboxd/sandboxd/httpapi"
)

// ProviderRunBeginOptions opens a provider run.
type ProviderRunBeginOptions struct {
	// Message is the commit message of the run ("" is the daemon's
	// default).
	Message string `json:"message,omitempty"`
}

// ProviderRunBeginResult is what ProviderRunBegin answers: nothing yet.
type ProviderRunBeginResult struct{}

// ProviderRunBegin opens a provider run (POST /v1/sessions/ID/provider-run):
// until it ends, workspace_exec and the structured tools make no commits
// of their own. A run already open is ErrForbidden.
func (c *Client) ProviderRunBegin(ctx context.Context, id string, opts ProviderRunBeginOptions) (ProviderRunBeginResult, error) {
	return ProviderRunBeginResult{}, c.sendJSON(ctx, http.MethodPost, sessionPath(id, "provider-run"), opts, nil)
}

// ProviderRunEndOptions says how a provider run ends.
type ProviderRunEndOptions struct {
	// Commit keeps the run's changes as one commit; false puts the
	// workspace back where the run began.
	Commit bool `json:"commit"`
}

// ProviderRunEndResult is how the run ended.
type ProviderRunEndResult struct {
	httpapi.ProviderRunResult
}

// ProviderRunEnd ends the provider run (POST
// /v1/sessions/ID/provider-run/end). No run open is ErrForbidden.
func (c *Client) ProviderRunEnd(ctx context.Context, id string, opts ProviderRunEndOptions) (ProviderRunEndResult, error) {
	var res ProviderRunEndResult
	err := c.sendJSON(ctx, http.MethodPost, sessionPath(id, "provider-run", "end"), opts, &res.ProviderRunResult)
	return res, err
}
