package client

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
)

// SnapshotCreateOptions is for SnapshotCreate; it has no fields yet.
type SnapshotCreateOptions struct{}

// SnapshotCreateResult is the snapshot made.
type SnapshotCreateResult struct {
	Snapshot snapshot.Info
}

// SnapshotCreate saves the session's workspace tree as a snapshot of the
// tenant's (POST /v1/sessions/ID/snapshots). The tenant's cap reached is
// ErrSnapshotLimit, a full store ErrNoSpace; nothing is left of a
// snapshot that failed.
func (c *Client) SnapshotCreate(ctx context.Context, session string, _ SnapshotCreateOptions) (SnapshotCreateResult, error) {
	var res SnapshotCreateResult
	err := c.sendJSON(ctx, http.MethodPost, sessionPath(session, "snapshots"), nil, &res.Snapshot)
	return res, err
}

// SnapshotListOptions is for SnapshotList; it has no fields yet.
type SnapshotListOptions struct{}

// SnapshotListResult is the tenant's snapshots, what they hold and the
// tenant's caps.
type SnapshotListResult struct {
	httpapi.SnapshotList
}

// SnapshotList lists the tenant's snapshots (GET /v1/snapshots).
func (c *Client) SnapshotList(ctx context.Context, _ SnapshotListOptions) (SnapshotListResult, error) {
	var res SnapshotListResult
	err := c.sendJSON(ctx, http.MethodGet, []string{"v1", "snapshots"}, nil, &res.SnapshotList)
	return res, err
}

// SnapshotInspectOptions is for SnapshotInspect; it has no fields yet.
type SnapshotInspectOptions struct{}

// SnapshotInspectResult describes a snapshot.
type SnapshotInspectResult struct {
	Snapshot snapshot.Info
}

// SnapshotInspect describes a snapshot (GET /v1/snapshots/ID); another
// tenant's is ErrNotFound.
func (c *Client) SnapshotInspect(ctx context.Context, id string, _ SnapshotInspectOptions) (SnapshotInspectResult, error) {
	var res SnapshotInspectResult
	err := c.sendJSON(ctx, http.MethodGet, []string{"v1", "snapshots", id}, nil, &res.Snapshot)
	return res, err
}

// SnapshotRemoveOptions is for SnapshotRemove; it has no fields yet.
type SnapshotRemoveOptions struct{}

// SnapshotRemoveResult is what SnapshotRemove answers: nothing yet.
type SnapshotRemoveResult struct{}

// SnapshotRemove deletes a snapshot (DELETE /v1/snapshots/ID); sessions
// started from it keep their files.
func (c *Client) SnapshotRemove(ctx context.Context, id string, _ SnapshotRemoveOptions) (SnapshotRemoveResult, error) {
	return SnapshotRemoveResult{}, c.sendJSON(ctx, http.MethodDelete, []string{"v1", "snapshots", id}, nil, nil)
}

// TemplateListOptions is for TemplateList; it has no fields yet.
type TemplateListOptions struct{}

// TemplateListResult is the operator's templates.
type TemplateListResult struct {
	httpapi.TemplateList
}

// TemplateList lists the templates sessions may start from
// (GET /v1/templates).
func (c *Client) TemplateList(ctx context.Context, _ TemplateListOptions) (TemplateListResult, error) {
	var res TemplateListResult
	err := c.sendJSON(ctx, http.MethodGet, []string{"v1", "templates"}, nil, &res.TemplateList)
	return res, err
}

// SessionForkOptions says how to fork a session.
type SessionForkOptions struct {
	// Count is how many sessions (1 to runner.MaxForks).
	Count int
	// Settings, when set, replace the source's, key by key: a JSON object
	// of runner.Settings' keys.
	Settings json.RawMessage
}

// SessionForkResult is the new sessions.
type SessionForkResult struct {
	Sessions []runner.Info
}

// SessionFork makes Count new sessions with the session's tree and
// settings (POST /v1/sessions/ID/fork), all or none.
func (c *Client) SessionFork(ctx context.Context, id string, opts SessionForkOptions) (SessionForkResult, error) {
	var out httpapi.ForkResult
	err := c.sendJSON(ctx, http.MethodPost, sessionPath(id, "fork"), httpapi.ForkRequest{Count: opts.Count, Settings: opts.Settings}, &out)
	return SessionForkResult{Sessions: out.Sessions}, err
}

// SessionPauseOptions is for SessionPause; it has no fields yet.
type SessionPauseOptions struct{}

// SessionPauseResult is the session, paused.
type SessionPauseResult struct {
	Session runner.Info
}

// SessionPause pauses the session (POST /v1/sessions/ID/pause): its
// workspace stops, giving back its CPU and memory and keeping its files;
// its processes and background commands end. Until SessionResume its
// calls fail with ErrPaused (unless the daemon resumes it on its own,
// autoResume). A backend that cannot pause is ErrPauseOff.
func (c *Client) SessionPause(ctx context.Context, id string, _ SessionPauseOptions) (SessionPauseResult, error) {
	var res SessionPauseResult
	err := c.sendJSON(ctx, http.MethodPost, sessionPath(id, "pause"), nil, &res.Session)
	return res, err
}

// SessionResumeOptions is for SessionResume; it has no fields yet.
type SessionResumeOptions struct{}

// SessionResumeResult is the session, running.
type SessionResumeResult struct {
	Session runner.Info
}

// SessionResume brings a paused session back (POST
// /v1/sessions/ID/resume): the same ID, settings and files; a session
// that runs is answered as it is.
func (c *Client) SessionResume(ctx context.Context, id string, _ SessionResumeOptions) (SessionResumeResult, error) {
	var res SessionResumeResult
	err := c.sendJSON(ctx, http.MethodPost, sessionPath(id, "resume"), nil, &res.Session)
	return res, err
}
