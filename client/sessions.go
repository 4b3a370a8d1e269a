package client

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/sandboxd/sandboxd/runner"
)

// SessionCreateOptions says what session to create.
type SessionCreateOptions struct {
	// Settings are the session's: grants, skills, image, lifetimes, actor
	// scope… (runner.Settings; the daemon's configuration bounds them).
	Settings runner.Settings
}

// SessionCreateResult is the session created.
type SessionCreateResult struct {
	Session runner.Info
}

// SessionCreate starts a session (POST /v1/sessions). A setting beyond the
// operator's is ErrForbidden, naming it; the tenant's cap reached is
// ErrTooManySessions.
//
// The settings' SecretValues are sent with their values, which their own
// JSON leaves out (runner.TenantSecret).
func (c *Client) SessionCreate(ctx context.Context, opts SessionCreateOptions) (SessionCreateResult, error) {
	var res SessionCreateResult
	var body any = opts.Settings
	if len(opts.Settings.SecretValues) > 0 {
		data, err := json.Marshal(opts.Settings)
		if err != nil {
			return res, err
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			return res, err
		}
		type withValue runner.TenantSecret // no MarshalJSON: the value goes too
		values := make([]withValue, len(opts.Settings.SecretValues))
		for i, v := range opts.Settings.SecretValues {
			values[i] = withValue(v)
		}
		m["secretValues"] = values
		body = m
	}
	err := c.sendJSON(ctx, http.MethodPost, []string{"v1", "sessions"}, body, &res.Session)
	return res, err
}

// SessionListOptions is for SessionList; it has no fields yet.
type SessionListOptions struct{}

// SessionListResult lists the tenant's sessions.
type SessionListResult struct {
	Sessions []runner.Info `json:"sessions"`
}

// SessionList lists the tenant's sessions (GET /v1/sessions).
func (c *Client) SessionList(ctx context.Context, _ SessionListOptions) (SessionListResult, error) {
	var res SessionListResult
	err := c.sendJSON(ctx, http.MethodGet, []string{"v1", "sessions"}, nil, &res)
	return res, err
}

// SessionInspectOptions is for SessionInspect; it has no fields yet.
type SessionInspectOptions struct{}

// SessionInspectResult describes a session.
type SessionInspectResult struct {
	Session runner.Info
}

// SessionInspect describes a session (GET /v1/sessions/ID); another
// tenant's, or one that has ended, is ErrNotFound.
func (c *Client) SessionInspect(ctx context.Context, id string, _ SessionInspectOptions) (SessionInspectResult, error) {
	var res SessionInspectResult
	err := c.sendJSON(ctx, http.MethodGet, sessionPath(id), nil, &res.Session)
	return res, err
}

// SessionRemoveOptions is for SessionRemove; it has no fields yet.
type SessionRemoveOptions struct{}

// SessionRemoveResult is what SessionRemove answers: nothing yet.
type SessionRemoveResult struct{}

// SessionRemove ends a session (DELETE /v1/sessions/ID): its calls in
// flight are cancelled and its workspace removed.
func (c *Client) SessionRemove(ctx context.Context, id string, _ SessionRemoveOptions) (SessionRemoveResult, error) {
	return SessionRemoveResult{}, c.sendJSON(ctx, http.MethodDelete, sessionPath(id), nil, nil)
}
