package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
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
	// Detach starts the call and answers at once (202, a CallStatus): the
	// call goes on whether or not the client stays, and its result is
	// fetched with GET /v1/sessions/ID/calls/CALL.
	Detach bool `json:"detach,omitempty"`
}

// CallStatus is a detached call: running, or ended with its result (or
// Error when it failed outside the tool, such as the session ending).
type CallStatus struct {
	ID      string      `json:"id"`
	Tool    string      `json:"tool"`
	Started time.Time   `json:"started"`
	Done    bool        `json:"done"`
	Ended   *time.Time  `json:"ended,omitempty"`
	Result  *CallResult `json:"result,omitempty"`
	Error   *errorBody  `json:"error,omitempty"`
}

func callStatus(d *runner.Detached) CallStatus {
	st := CallStatus{ID: d.ID, Tool: d.Tool, Started: d.Started}
	res, err, done := d.Result()
	if !done {
		return st
	}
	ended := d.Ended()
	st.Done, st.Ended = true, &ended
	if err != nil {
		_, kind := classify(err)
		st.Error = &errorBody{Error: kind, Message: err.Error()}
	} else {
		cr := callResult(res)
		st.Result = &cr
	}
	return st
}

// maxCallWait bounds how long GET .../calls/CALL?wait= may wait.
const maxCallWait = 10 * time.Minute

// getCall answers a detached call's status; with ?wait=SECONDS it first
// waits up to that long (at most maxCallWait) for the call to end.
func (s *Server) getCall(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	d, err := sess.Detached(r.PathValue("call"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if v := r.URL.Query().Get("wait"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs < 0 || secs > maxCallWait.Seconds() || math.IsNaN(secs) {
			writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), fmt.Sprintf("wait: %q is not a number of seconds from 0 to %g", v, maxCallWait.Seconds()))
			return
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-d.Done():
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	writeStatus(w, callStatus(d))
}

// writeStatus answers st as writeJSON would, its result written by
// writeResult.
func writeStatus(w http.ResponseWriter, st CallStatus) {
	res := st.Result
	st.Result = nil
	head := marshal(st)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if res == nil {
		w.Write(head)
		return
	}
	w.Write(head[:len(head)-1]) // the object is left open for the result
	io.WriteString(w, `,"result":`)
	writeResult(w, *res)
	io.WriteString(w, "}\n")
}

// writeResult writes r as JSON, as writeJSON would, but the bytes of an
// image go through a base64 encoder straight to w: answering a result of
// megabytes (a detached call's, kept) holds no copy of it, where
// encoding/json would hold its base64 whole, in a buffer grown by doubling.
func writeResult(w io.Writer, r CallResult) error {
	bw := resultWriters.Get().(*bufio.Writer)
	bw.Reset(w)
	defer func() {
		bw.Reset(nil) // holds no response past its call
		resultWriters.Put(bw)
	}()
	bw.WriteString(`{"content":[`)
	for i, c := range r.Content {
		if i > 0 {
			bw.WriteByte(',')
		}
		data := c.Data
		c.Data = nil
		head := marshal(c)
		if len(data) == 0 {
			bw.Write(head)
			continue
		}
		bw.Write(head[:len(head)-1])
		bw.WriteString(`,"data":"`)
		enc := base64.NewEncoder(base64.StdEncoding, bw)
		enc.Write(data)
		enc.Close()
		bw.WriteString(`"}`)
	}
	bw.WriteString(`],"structuredContent":`)
	bw.Write(marshal(r.StructuredContent))
	fmt.Fprintf(bw, `,"isError":%t}`, r.IsError)
	return bw.Flush()
}

// resultWriters are writeResult's buffers, kept between calls: each would
// otherwise allocate and clear writeChunk bytes to answer a result of a
// few hundred.
var resultWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeChunk) }}

// marshal is v's JSON as writeJSON writes it, without its newline.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte("null")
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
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
	if req.Detach {
		d, err := sess.Detach(runner.DetachRequest{Tool: r.PathValue("tool"), Args: req.Arguments, Options: opts, Hold: s.resultHold(tenantOf(r).Name)})
		if err != nil {
			s.fail(w, r, err)
			return
		}
		w.Header().Set("Location", "/v1/sessions/"+sess.ID()+"/calls/"+d.ID)
		writeJSON(w, http.StatusAccepted, callStatus(d))
		return
	}
	var events *eventStream
	if acceptsEvents(r) {
		events = &eventStream{w: w}
		opts.Progress = func(p tools.Progress) { events.send("output", p) }
	}
	res, err := sess.Call(r.Context(), r.PathValue("tool"), req.Arguments, opts)
	if werr := writeFailure(w); werr != nil {
		s.o.logger.Warn("call cut: its client stopped reading", "tenant", tenantOf(r).Name, "session", sess.ID(), "tool", r.PathValue("tool"), "error", werr)
		return
	}
	switch {
	case err != nil && events != nil && events.started:
		_, kind := classify(err)
		events.send("error", errorBody{Error: kind, Message: err.Error()})
	case err != nil:
		s.fail(w, r, err)
	case events != nil:
		events.send("result", callResult(res))
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		writeResult(w, callResult(res))
		io.WriteString(w, "\n")
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
// response starts with the first event. Each write has the server's write
// deadline (deadlineWriter): a client that stops reading has its call
// canceled, and bash, whose progress waits in a bounded buffer
// (tools.ProgressCap), is slowed until then rather than buffered.
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

// ProviderRunResult is how a provider run ended.
type ProviderRunResult struct {
	// Committed says its changes were kept; Commit is the commit they made
	// (absent when nothing changed).
	Committed bool             `json:"committed"`
	Commit    *journal.Summary `json:"commit,omitempty"`
	// Restored says the workspace was put back where the run began.
	Restored bool `json:"restored,omitempty"`
	// Unrestored are paths that could not be put back exactly.
	Unrestored []string `json:"unrestored,omitempty"`
	// OutOfScope are paths changed outside the session's commit rules:
	// put back, not committed.
	OutOfScope []string `json:"outOfScope,omitempty"`
	// Protected are paths changed under .sandboxd/, which only sandboxd
	// writes: put back, however the run ended.
	Protected []string `json:"protected,omitempty"`
}

// beginProviderRun opens a provider run (tools.Set.BeginProviderRun).
func (s *Server) beginProviderRun(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	var req struct {
		Message string `json:"message"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	err := sess.Do(r.Context(), opProviderRun, func(ctx context.Context) (bool, error) {
		return false, sess.Tools().BeginProviderRun(ctx, req.Message)
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// endProviderRun ends the provider run, committing or restoring it.
func (s *Server) endProviderRun(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	var req struct {
		Commit *bool `json:"commit"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	if req.Commit == nil {
		writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), `request body: say {"commit": true} to keep the run's changes or {"commit": false} to put the workspace back`)
		return
	}
	var res ProviderRunResult
	err := sess.Do(r.Context(), opProviderRun, func(ctx context.Context) (bool, error) {
		out, err := sess.Tools().EndProviderRun(ctx, *req.Commit)
		res = ProviderRunResult{Committed: out.Committed, Restored: out.Restored, Unrestored: out.Unrestored, OutOfScope: out.OutOfScope, Protected: out.Protected}
		if out.Commit != nil {
			sum := out.Commit.Summary()
			res.Commit = &sum
		}
		return false, err
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// opProviderRun names the provider-run calls in metrics and the audit log.
const opProviderRun = "provider-run"
