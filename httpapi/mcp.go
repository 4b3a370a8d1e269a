package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcpserver"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// mcpHandler serves /mcp: MCP over streamable HTTP, one runner session per
// MCP session. An initialize request without Mcp-Session-Id starts a runner
// session for the token's tenant — with the settings of the query
// (?grant=fs.write&grant=shell.exec&always=read,shell&image=…) — or, with
// ?session=ID, serves that existing session of the tenant's. A session
// started here ends with its MCP session (DELETE /mcp, or the client gone
// and the session idle); an MCP session ends with its runner session.
// Another tenant's Mcp-Session-Id is 404, as if it did not exist.
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
	}, &mcp.StreamableHTTPOptions{Logger: s.o.logger})
	return h
}

const sessionIDHeader = "Mcp-Session-Id"

func (h *mcpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := tenantOf(r).Name
	if id := r.Header.Get(sessionIDHeader); id != "" {
		h.mu.Lock()
		ms := h.sessions[id]
		h.mu.Unlock()
		if ms == nil || ms.tenant != tenant {
			writeError(w, http.StatusNotFound, "NotFound", "no such MCP session")
			return
		}
		h.h.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodPost {
		h.h.ServeHTTP(w, r) // the SDK answers what is wrong with it
		return
	}
	ms, err := h.open(r)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	var id string
	cw := &headerHook{ResponseWriter: w, hook: func() {
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
		sess, err := h.s.m.Create(r.Context(), runner.CreateRequest{Tenant: t.Name, Settings: st, MaxSessions: t.MaxSessions})
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
