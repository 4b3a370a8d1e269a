package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcpserver"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// mcpHandler serves /mcp: MCP over streamable HTTP, one runner session per
// MCP session. An initialize request without Mcp-Session-Id starts a runner
// session for the token's tenant — with the settings of the query
// (?grant=fs.write&grant=shell.exec&always=read,shell&image=…&egress=go) — or, with
// ?session=ID, serves that existing session of the tenant's. A session
// started here ends with its MCP session (DELETE /mcp, or the client gone
// and the session idle); an MCP session ends with its runner session.
// Another tenant's Mcp-Session-Id is 404, as if it did not exist.
//
// Every POST is read (up to the daemon's body limit) and checked before the
// SDK sees it, and whatever is wrong with it is answered with a JSON-RPC
// error, with the request's ID where it has one: -32700 for a body that is
// not JSON, -32600 for one that is not JSON-RPC messages, a POST without
// Mcp-Session-Id that is not an initialize request, or a body over the limit
// (413); -32601 for a method the server does not have. Nothing starts for a
// POST until it is a valid initialize request.
type mcpHandler struct {
	s *Server
	h *mcp.StreamableHTTPHandler

	mu       sync.Mutex
	sessions map[string]*mcpSession // by Mcp-Session-Id
}

type mcpSession struct {
	tenant string
	sess   *runner.Session
	owned  bool // started for this MCP session, ended with it
	server *mcp.Server
}

type pendingKey struct{}

func newMCPHandler(s *Server) *mcpHandler {
	h := &mcpHandler{s: s, sessions: map[string]*mcpSession{}}
	h.h = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if p, ok := r.Context().Value(pendingKey{}).(*mcpSession); ok {
			return p.server
		}
		return nil
	}, &mcp.StreamableHTTPOptions{Logger: s.o.logger, MaxRequestBodyBytes: s.o.maxBody})
	return h
}

const sessionIDHeader = "Mcp-Session-Id"

func (h *mcpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := tenantOf(r).Name
	id := r.Header.Get(sessionIDHeader)
	if id != "" {
		h.mu.Lock()
		ms := h.sessions[id]
		h.mu.Unlock()
		if ms == nil || ms.tenant != tenant {
			writeError(w, http.StatusNotFound, "NotFound", "no such MCP session")
			return
		}
	}
	if r.Method != http.MethodPost {
		h.h.ServeHTTP(w, r) // the SDK answers what is wrong with it
		return
	}
	req, ok := h.read(w, r)
	if !ok {
		return
	}
	rw := &rpcErrors{ResponseWriter: w}
	if req != nil {
		rw.id, rw.method = req.ID, req.Method
	}
	defer rw.finish()
	if id != "" {
		h.h.ServeHTTP(rw, r)
		return
	}
	if fe := initializeOnly(r, req); fe != nil {
		writeRPCError(w, http.StatusBadRequest, fe)
		return
	}
	ms, err := h.open(r)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	cw := &headerHook{ResponseWriter: rw, hook: func() {
		// Registered before the answer leaves, so the client's next request
		// (notifications/initialized) finds the session.
		if id = w.Header().Get(sessionIDHeader); id != "" {
			h.mu.Lock()
			h.sessions[id] = ms
			h.mu.Unlock()
		}
	}}
	h.h.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), pendingKey{}, ms)))
	var ss *mcp.ServerSession
	for s := range ms.server.Sessions() {
		ss = s
	}
	if id == "" || ss == nil {
		h.forget(id, ms) // initialization failed
		return
	}
	go h.watch(id, ms, ss)
}

// read reads and decodes a POST's body, which it leaves in r for the SDK
// to read again, and returns its request when it is one (not a batch, not a
// response). What is wrong with the body, it answers.
func (h *mcpHandler) read(w http.ResponseWriter, r *http.Request) (*jsonrpc.Request, bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.s.o.maxBody))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeRPCError(w, http.StatusRequestEntityTooLarge, mcpserver.Refuse(jsonrpc.ID{}, jsonrpc.CodeInvalidRequest,
			"invalid request: the body is over the limit of %d bytes (limits.maxBodyBytes in the daemon's configuration)", mbe.Limit))
		return nil, false
	case err != nil:
		h.s.fail(w, r, err)
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	msgs, batch, err := mcpserver.Decode(data)
	if err != nil {
		var fe *mcpserver.FrameError
		errors.As(err, &fe)
		writeRPCError(w, http.StatusBadRequest, fe)
		return nil, false
	}
	req, _ := msgs[0].(*jsonrpc.Request)
	if batch {
		req = nil
	}
	return req, true
}

// initializeOnly refuses a POST without Mcp-Session-Id unless it is one
// initialize request (req) the SDK will take (the headers it requires), so
// that no workspace starts for anything else.
func initializeOnly(r *http.Request, req *jsonrpc.Request) *mcpserver.FrameError {
	if req == nil || req.Method != "initialize" || !req.IsCall() {
		var id jsonrpc.ID
		if req != nil {
			id = req.ID
		}
		return mcpserver.Refuse(id, jsonrpc.CodeInvalidRequest,
			"invalid request: no MCP session (no %s header): the first POST is one initialize request, alone", sessionIDHeader)
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return mcpserver.Refuse(req.ID, jsonrpc.CodeInvalidRequest, "invalid request: Content-Type must be application/json")
	}
	accept := strings.ToLower(strings.Join(r.Header.Values("Accept"), ","))
	if !strings.Contains(accept, "*/*") && (!strings.Contains(accept, "application/json") || !strings.Contains(accept, "text/event-stream")) {
		return mcpserver.Refuse(req.ID, jsonrpc.CodeInvalidRequest, "invalid request: Accept must name application/json and text/event-stream")
	}
	return nil
}

// writeRPCError answers with fe as a JSON-RPC response.
func writeRPCError(w http.ResponseWriter, status int, fe *mcpserver.FrameError) {
	retryLater(w, status)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(fe.Encode())
}

// mcpMethods are the methods the SDK's server takes from a client (go-sdk
// v1.8.0's serverMethodInfos). When the SDK refuses a request, in plain
// text, for one of these it is the request's form (an ID where none goes, no
// params): -32600; any other method is one the server does not have: -32601.
var mcpMethods = []string{
	"initialize", "ping", "tools/list", "tools/call", "prompts/list", "prompts/get",
	"resources/list", "resources/templates/list", "resources/read", "resources/subscribe",
	"resources/unsubscribe", "logging/setLevel", "completion/complete",
	"server/discover", "subscriptions/listen",
	"notifications/initialized", "notifications/cancelled", "notifications/progress",
	"notifications/roots/list_changed",
}

// rpcErrors turns an error the SDK answers in plain text into a JSON-RPC
// error with the same status, answering the request's ID when the POST
// was one request.
type rpcErrors struct {
	http.ResponseWriter
	id     jsonrpc.ID
	method string
	status int          // set when an error is held
	text   bytes.Buffer // the SDK's message
}

func (w *rpcErrors) WriteHeader(code int) {
	if w.status == 0 && code >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *rpcErrors) Write(p []byte) (int, error) {
	if w.status != 0 {
		return w.text.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

func (w *rpcErrors) Flush() {
	if w.status == 0 {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *rpcErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish sends the error held, if any.
func (w *rpcErrors) finish() {
	if w.status == 0 {
		return
	}
	code := int64(jsonrpc.CodeInvalidRequest)
	if w.method != "" && !slices.Contains(mcpMethods, w.method) {
		code = jsonrpc.CodeMethodNotFound
	}
	w.Header().Del("X-Content-Type-Options")
	writeRPCError(w.ResponseWriter, w.status, mcpserver.Refuse(w.id, code, "%s", strings.TrimSpace(w.text.String())))
}

// open finds or starts the runner session of a new MCP session and builds
// its MCP server.
func (h *mcpHandler) open(r *http.Request) (*mcpSession, error) {
	t := tenantOf(r)
	q := r.URL.Query()
	ms := &mcpSession{tenant: t.Name}
	if id := q.Get("session"); id != "" {
		sess, err := h.s.m.Get(t.Name, id)
		if err != nil {
			return nil, err
		}
		ms.sess = sess
	} else {
		st := runner.Settings{Image: q.Get("image"), Grants: splitList(q["grant"])}
		if q.Has("always") {
			st.Always = splitList(q["always"])
		}
		if q.Has("egress") { // as a session's "egress": narrows what the tenant may reach
			st.Egress = splitList(q["egress"])
		}
		sess, err := h.s.m.Create(r.Context(), runner.CreateRequest{Tenant: t.Name, Settings: st, MaxSessions: t.MaxSessions, MaxSecrets: t.MaxSecrets, Egress: t.Egress})
		if err != nil {
			return nil, err
		}
		ms.sess, ms.owned = sess, true
	}
	srv := mcpserver.New(ms.sess.Tools(), mcpserver.WithImplementation("sandboxd", h.s.o.version), mcpserver.WithLogger(h.s.o.logger))
	ms.server = srv.MCP()
	ms.server.AddReceivingMiddleware(callsThrough(ms.sess))
	return ms, nil
}

// callsThrough makes every tools/call go through the session's Do: its cap
// of calls in flight, its activity, its audit line and metrics. A call
// refused there is a tool failure the model can read.
func callsThrough(sess *runner.Session) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || method != "tools/call" {
				return next(ctx, method, req)
			}
			var res mcp.Result
			err := sess.Do(ctx, call.Params.Name, func(ctx context.Context) (bool, error) {
				var err error
				res, err = next(ctx, method, req)
				ctr, _ := res.(*mcp.CallToolResult)
				return ctr != nil && ctr.IsError, err
			})
			if err != nil && (errors.Is(err, runner.ErrBusy) || errors.Is(err, runner.ErrClosed)) {
				_, kind := classify(err)
				return &mcp.CallToolResult{
					Content:           []mcp.Content{&mcp.TextContent{Text: kind + ": " + err.Error()}},
					StructuredContent: tools.ErrorResult{Error: kind, Message: err.Error()},
					IsError:           true,
				}, nil
			}
			return res, err
		}
	}
}

// watch ends the pair together: the runner session when the MCP session
// closes, the MCP session when the runner session ends.
func (h *mcpHandler) watch(id string, ms *mcpSession, ss *mcp.ServerSession) {
	closed := make(chan struct{})
	go func() { ss.Wait(); close(closed) }()
	select {
	case <-closed:
	case <-ms.sess.Done():
		ss.Close()
		<-closed
	}
	h.forget(id, ms)
}

func (h *mcpHandler) forget(id string, ms *mcpSession) {
	if id != "" {
		h.mu.Lock()
		delete(h.sessions, id)
		h.mu.Unlock()
	}
	if ms.owned {
		// Gone already (expired, deleted) is fine.
		_ = h.s.m.Delete(context.Background(), ms.tenant, ms.sess.ID())
	}
}

// splitList splits repeated, comma-separated query values.
func splitList(values []string) []string {
	var out []string
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

// headerHook calls hook once, just before the response's header is sent.
type headerHook struct {
	http.ResponseWriter
	hook func()
	once sync.Once
}

func (w *headerHook) WriteHeader(code int) {
	w.once.Do(w.hook)
	w.ResponseWriter.WriteHeader(code)
}

func (w *headerHook) Write(p []byte) (int, error) {
	w.once.Do(w.hook)
	return w.ResponseWriter.Write(p)
}

func (w *headerHook) Flush() {
	w.once.Do(w.hook)
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *headerHook) Unwrap() http.ResponseWriter { return w.ResponseWriter }
