// Package client is a Go client of sandboxd's HTTP API (package httpapi),
// in the shape of moby's: one method per endpoint, each taking a context,
// the session's ID where there is one, and an options struct, and
// returning a result struct:
//
//	c, err := client.New(client.FromEnv) // SANDBOXD_URL, SANDBOXD_TOKEN
//	s, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{Grants: []string{"shell.exec"}}})
//	res, err := c.ToolCall(ctx, s.Session.ID, client.ToolCallOptions{Tool: "bash", Arguments: map[string]any{"command": "make"}})
//
// The daemon's error answers are *Error values that match, with errors.Is,
// the sentinel of their kind: ErrSessionEnded, ErrOverloaded, … for the
// daemon's own kinds, and the workspace kinds (workspace.ErrNotFound, which
// ErrNotFound is; workspace.ErrForbidden, …) for the rest. A tool that ran
// and failed is no error: its result says IsError, as over MCP.
//
// A Client is safe for concurrent use. It holds no connection of its own:
// its http.Client (WithHTTPClient, default http.DefaultClient) does.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// DefaultURL is where a daemon listens unless told otherwise.
const DefaultURL = "http://127.0.0.1:7878"

// Client talks to one daemon as one tenant.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// Opt configures New.
type Opt func(*Client) error

// WithBaseURL sets the daemon's address, "http://host:port" (default
// DefaultURL). A path in it prefixes every request's.
func WithBaseURL(rawURL string) Opt {
	return func(c *Client) error {
		u, err := url.Parse(rawURL)
		if err != nil {
			return fmt.Errorf("client: the daemon's URL: %w", err)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("client: the daemon's URL %q: want http://HOST:PORT or https://…", rawURL)
		}
		u.Path = strings.TrimSuffix(u.Path, "/")
		c.base = u
		return nil
	}
}

// WithToken sets the tenant's bearer token, sent with every request.
func WithToken(token string) Opt {
	return func(c *Client) error { c.token = token; return nil }
}

// WithHTTPClient sets the http.Client requests go through (timeouts,
// transport, proxies). Default: http.DefaultClient.
func WithHTTPClient(hc *http.Client) Opt {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient(nil)")
		}
		c.http = hc
		return nil
	}
}

// FromEnv takes the address from SANDBOXD_URL and the token from
// SANDBOXD_TOKEN, where they are set; options after it override them.
func FromEnv(c *Client) error {
	if u := os.Getenv("SANDBOXD_URL"); u != "" {
		if err := WithBaseURL(u)(c); err != nil {
			return err
		}
	}
	if t := os.Getenv("SANDBOXD_TOKEN"); t != "" {
		c.token = t
	}
	return nil
}

// New returns a client configured by opts, applied in order.
func New(opts ...Opt) (*Client, error) {
	c := &Client{http: http.DefaultClient}
	if err := WithBaseURL(DefaultURL)(c); err != nil {
		return nil, err
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// BaseURL returns the daemon's address as configured.
func (c *Client) BaseURL() string { return c.base.String() }

// request is one call of the API.
type request struct {
	method string
	path   []string // segments, escaped when joined
	query  url.Values
	body   io.Reader
	header http.Header
}

// sessionPath is the path of a session's resource: /v1/sessions/ID/rest….
func sessionPath(id string, rest ...string) []string {
	return append([]string{"v1", "sessions", id}, rest...)
}

// send sends r and returns the response of a status under 300, whose body
// the caller closes; any other answer is an *Error.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	var p strings.Builder
	p.WriteString(c.base.EscapedPath())
	for _, seg := range r.path {
		p.WriteString("/" + url.PathEscape(seg))
	}
	u := *c.base
	u.RawPath = p.String()
	u.Path, _ = url.PathUnescape(u.RawPath) // escaped just above
	u.RawQuery = r.query.Encode()
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), r.body)
	if err != nil {
		return nil, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 300 {
		defer res.Body.Close()
		return nil, errorOf(res)
	}
	return res, nil
}

// sendJSON sends in (when not nil) as JSON and decodes the answer into out
// (when not nil).
func (c *Client) sendJSON(ctx context.Context, method string, path []string, in, out any) error {
	r := request{method: method, path: path, header: http.Header{}}
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		r.body = bytes.NewReader(data)
		r.header.Set("Content-Type", "application/json")
	}
	res, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, res.Body)
		return err
	}
	return decode(res, out)
}

// decode reads a JSON answer into out.
func decode(res *http.Response, out any) error {
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("client: %s %s: the answer: %w", res.Request.Method, res.Request.URL.Path, err)
	}
	return nil
}
