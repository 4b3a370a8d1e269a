package client

import (
	"context"
	"net/http"

	"github.com/sandboxd/sandboxd/runner"
)

// SessionEgressOptions is for SessionEgress; it has no fields yet.
type SessionEgressOptions struct{}

// SessionEgressResult is a session's egress: the rules in force, its own,
// and its secrets' names.
type SessionEgressResult struct {
	Egress runner.EgressPolicy
}

// SessionEgress describes a session's egress (GET /v1/sessions/ID/egress).
func (c *Client) SessionEgress(ctx context.Context, id string, _ SessionEgressOptions) (SessionEgressResult, error) {
	var res SessionEgressResult
	err := c.sendJSON(ctx, http.MethodGet, sessionPath(id, "egress"), nil, &res.Egress)
	return res, err
}

// SessionEgressSetOptions are a session's new egress rules.
type SessionEgressSetOptions struct {
	// Allow are HOST:PORT rules and presets, within the tenant's egress;
	// an empty list is no egress. With Reset it is ignored.
	Allow []string
	// Reset goes back to the tenant's egress (the operator's, as the
	// tenant's narrows it).
	Reset bool
}

// SessionEgressSetResult is the session's egress as changed.
type SessionEgressSetResult struct {
	Egress runner.EgressPolicy
}

// SessionEgressSet changes a live session's egress (PUT
// /v1/sessions/ID/egress): from then on its connections are judged by the
// new rules, and open ones they do not allow are cut. A rule beyond the
// tenant's egress is ErrForbidden, naming it.
func (c *Client) SessionEgressSet(ctx context.Context, id string, opts SessionEgressSetOptions) (SessionEgressSetResult, error) {
	body := map[string]any{"allow": opts.Allow}
	if opts.Reset {
		body["allow"] = nil
	} else if opts.Allow == nil {
		body["allow"] = []string{}
	}
	var res SessionEgressSetResult
	err := c.sendJSON(ctx, http.MethodPut, sessionPath(id, "egress"), body, &res.Egress)
	return res, err
}
