package httpapi

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/tools"
)

func (s *Server) listTools(w http.ResponseWriter, r *http.Request) {
	if sess, ok := s.session(w, r); ok {
		// The catalogue as `sandboxd tools --json` prints it.
		writeJSON(w, http.StatusOK, sess.Tools().Catalogue())
	}
}

// callRequest is the body of a tool call.
type callRequest struct {
	// Arguments are the tool's arguments, as over MCP.
	Arguments json.RawMessage `json:"arguments"`
	// RunID names the run (an agent's turn) the call counts against.
	RunID string `json:"runId,omitempty"`
}

// CallResult is a tool call's answer, in the shape of MCP's CallToolResult.
type CallResult struct {
	Content           []Content `json:"content"`
	StructuredContent any       `json:"structuredContent"`
	IsError           bool      `json:"isError"`
}

// Content is one piece of a result's content: text for the model, or an
// image (Data is base64 in JSON).
type Content struct {
	Type     string `json:"type"` // "text" or "image"
	Text     string `json:"text,omitempty"`
	Data     []byte `json:"data,omitempty"`
	MIMEType string `json:"mimeType,omitempty"`
}

func callResult(r tools.Result) CallResult {
	out := CallResult{Content: []Content{{Type: "text", Text: r.Text}}, StructuredContent: r.Structured, IsError: r.IsError}
	if out.StructuredContent == nil {
		out.StructuredContent = map[string]any{}
	}
	if r.Image != nil {
		out.Content = append(out.Content, Content{Type: "image", Data: r.Image.Data, MIMEType: r.Image.MIMEType})
	}
	return out
}

// callTool runs one tool. With Accept: text/event-stream the answer is a
// stream of "output" events (bash's output as it runs) and one "result"
// event, or an "error" event when the call failed after output was sent.
// Until the first event, failures are ordinary error responses (429, 410…).
func (s *Server) callTool(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	var req callRequest
	if !s.decode(w, r, &req) {
		return
	}
	opts := tools.CallOptions{RunID: req.RunID}
	var events *eventStream
	if acceptsEvents(r) {
		events = &eventStream{w: w}
		opts.Progress = func(p tools.Progress) { events.send("output", p) }
	}
	res, err := sess.Call(r.Context(), r.PathValue("tool"), req.Arguments, opts)
	switch {
	case err != nil && events != nil && events.started:
		_, kind := classify(err)
		events.send("error", errorBody{Error: kind, Message: err.Error()})
	case err != nil:
		s.fail(w, r, err)
	case events != nil:
		events.send("result", callResult(res))
	default:
		writeJSON(w, http.StatusOK, callResult(res))
	}
}

// acceptsEvents reports whether r asks for server-sent events.
func acceptsEvents(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// eventStream writes server-sent events, each flushed at once. The
// response starts with the first event.
type eventStream struct {
	w       http.ResponseWriter
	started bool
}

func (e *eventStream) send(event string, v any) {
	if !e.started {
		h := e.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	data, err := json.Marshal(v)
	if err != nil {
		data, _ = json.Marshal(errorBody{Error: "Internal", Message: err.Error()})
		event = "error"
	}
	// JSON has no raw newlines, so one data line carries the event.
	fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, data)
	_ = http.NewResponseController(e.w).Flush()
}
