package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/tools"
)

// ToolListOptions is for ToolList; it has no fields yet.
type ToolListOptions struct{}

// ToolListResult is a session's catalogue, as `sandboxd tools --json`
// prints it: its tools (the workspace-shell capability entry among them,
// by its name, when the session has that profile) and skills.
type ToolListResult struct {
	Tools  []tools.Tool  `json:"tools"`
	Skills []tools.Skill `json:"skills"`
}

// ToolList returns a session's catalogue (GET /v1/sessions/ID/tools).
func (c *Client) ToolList(ctx context.Context, id string, _ ToolListOptions) (ToolListResult, error) {
	var res ToolListResult
	err := c.sendJSON(ctx, http.MethodGet, sessionPath(id, "tools"), nil, &res)
	return res, err
}

// ToolCallOptions is one tool call.
type ToolCallOptions struct {
	// Tool is the tool's name: "bash", "read", …
	Tool string
	// Arguments are the tool's arguments: anything that marshals to a JSON
	// object (a json.RawMessage is sent as it is); nil is {}.
	Arguments any
	// RunID names the run (an agent's turn) the call counts against.
	RunID string
	// Output, when set, receives bash's output as the command writes it:
	// the call is then answered as server-sent events.
	Output io.Writer
}

// ToolCallResult is a call's answer, in the shape of MCP's
// CallToolResult. A tool that ran and failed has IsError set (and its
// kind in StructuredContent's "error"); that is no error of the call.
type ToolCallResult struct {
	httpapi.CallResult
}

// ToolCall calls a tool of a session (POST /v1/sessions/ID/tools/TOOL).
// The error is the call's: ErrBusy, ErrSessionEnded, a cancelled ctx…
func (c *Client) ToolCall(ctx context.Context, id string, opts ToolCallOptions) (ToolCallResult, error) {
	var res ToolCallResult
	args, err := arguments(opts.Arguments)
	if err != nil {
		return res, err
	}
	body, err := json.Marshal(struct {
		Arguments json.RawMessage `json:"arguments"`
		RunID     string          `json:"runId,omitempty"`
	}{args, opts.RunID})
	if err != nil {
		return res, err
	}
	h := http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"}}
	if opts.Output != nil {
		h.Set("Accept", "text/event-stream, application/json")
	}
	resp, err := c.send(ctx, request{method: http.MethodPost, path: sessionPath(id, "tools", opts.Tool), body: bytes.NewReader(body), header: h})
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return res, decode(resp, &res.CallResult)
	}
	return res, readEvents(resp, opts.Output, &res.CallResult)
}

// arguments marshals a call's arguments; nil is {}.
func arguments(v any) (json.RawMessage, error) {
	switch a := v.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		if !json.Valid(a) {
			return nil, fmt.Errorf("client: the arguments are not JSON: %s", a)
		}
		return a, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("client: the arguments: %w", err)
	}
	return data, nil
}

// readEvents reads a call's server-sent events: "output" events' text goes
// to live, the "result" event into res; an "error" event (the call failed
// after output was sent) is an *Error.
func readEvents(resp *http.Response, live io.Writer, res *httpapi.CallResult) error {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			event = name
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		switch event {
		case "output":
			var p struct{ Text string }
			if err := json.Unmarshal([]byte(data), &p); err != nil {
				return fmt.Errorf("client: an output event: %w", err)
			}
			if _, err := io.WriteString(live, p.Text); err != nil {
				return err
			}
		case "result":
			return json.Unmarshal([]byte(data), res)
		case "error":
			e := &Error{StatusCode: resp.StatusCode}
			var body struct{ Error, Message string }
			json.Unmarshal([]byte(data), &body)
			e.Kind, e.Message = body.Error, body.Message
			return e
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("client: the daemon ended the stream without a result")
}
