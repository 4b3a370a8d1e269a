package client

import (
	"context"
	"net/http"
)

// PingOptions is for Ping; it has no fields yet.
type PingOptions struct{}

// PingResult is the daemon's readiness.
type PingResult struct {
	Status string `json:"status"` // "ready"
}

// Ping asks whether the daemon takes new work (GET /readyz, no token
// needed); a draining daemon is ErrShuttingDown.
func (c *Client) Ping(ctx context.Context, _ PingOptions) (PingResult, error) {
	var res PingResult
	err := c.sendJSON(ctx, http.MethodGet, []string{"readyz"}, nil, &res)
	return res, err
}
