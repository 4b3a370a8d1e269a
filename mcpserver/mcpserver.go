// Package mcpserver serves a session's workspace tools (package tools) over
// the Model Context Protocol, with github.com/modelcontextprotocol/go-sdk.
//
//	set, err := tools.New(tools.Env{FS: fsys, Bash: sh, Session: sess}, cfg)
//	...
//	err = mcpserver.New(set).Run(ctx, &mcpserver.LineTransport{Reader: os.Stdin, Writer: os.Stdout})
//
// What a client sees:
//
//   - tools/list names the tools active now, each with its input schema and
//     its output schema (MCP 2025-06-18's outputSchema: one of the tool's
//     result shapes, or the error shape below), and load_skill. When load_skill activates a skill, the skill's tools are
//     added and the server sends notifications/tools/list_changed.
//   - A tool result carries the text for the model as text content, the
//     tool's structured result as structuredContent and, for read of an
//     image, the image as image content. A failure sets isError, with
//     structuredContent {"error": KIND, "message": …}.
//   - While bash runs, a call that carries a progress token gets
//     notifications/progress: each one's message is a run of output from one
//     stream (named in _meta["sandboxd/stream"]), its progress the number of
//     output bytes published so far.
//   - The server's instructions are the set's environment section.
//   - A tools/call of a tool not served now (its skill not loaded, or no
//     such tool) is a tool failure that says so, as over HTTP, not the
//     SDK's JSON-RPC error "unknown tool".
//
// Bad input. LineTransport, for stdio, answers a line that is not a valid
// message with a JSON-RPC error and goes on, where the SDK's transports
// end the session; Decode and FrameError are the same checks and answers
// for other transports (httpapi's /mcp).
//
// Runs. The tool set caps calls per run (maxCallsPerRun). MCP has no notion
// of an agent's turn, so a client that has one names it in the call's
// _meta["sandboxd/runId"]; calls without it count against the session's run.
package mcpserver

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/tools"
)

// Meta keys sandboxd reads from and writes to MCP messages' _meta.
const (
	// MetaRunID, in a tools/call's _meta, names the run the call belongs to.
	MetaRunID = "sandboxd/runId"
	// MetaStream, in a progress notification's _meta, names the stream
	// ("stdout" or "stderr") the message's output came from.
	MetaStream = "sandboxd/stream"
	// MetaCommit, in a tool result's _meta, is the journal commit the call
	// made (id, message, paths), when it changed files.
	MetaCommit = "sandboxd/commit"
)

// Server serves one tool set over MCP. It is safe for concurrent use.
type Server struct {
	set *tools.Set
	mcp *mcp.Server

	mu     sync.Mutex
	served []string // the tool names registered with mcp, in catalogue order
}

// Option configures New.
type Option func(*options)

type options struct {
	impl         mcp.Implementation
	logger       *slog.Logger
	instructions *string
}

// WithImplementation sets the name and version the server reports to
// clients (default "sandboxd", "devel").
func WithImplementation(name, version string) Option {
	return func(o *options) { o.impl.Name, o.impl.Version = name, version }
}

// WithLogger logs the MCP server's activity to l (default: nothing).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithInstructions replaces the server's instructions, which are by default
// the tool set's environment section.
func WithInstructions(s string) Option { return func(o *options) { o.instructions = &s } }

// New returns a server for set's tools. It serves the tools active now; the
// set of served tools follows load_skill from then on.
func New(set *tools.Set, opts ...Option) *Server {
	o := options{impl: mcp.Implementation{Name: "sandboxd", Title: "sandboxd workspace", Version: "devel"}}
	for _, opt := range opts {
		opt(&o)
	}
	instructions := set.EnvironmentSection()
	if o.instructions != nil {
		instructions = *o.instructions
	}
	s := &Server{set: set}
	s.mcp = mcp.NewServer(&o.impl, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       o.logger,
		// Tools with list_changed, and nothing else: no logging capability.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	})
	s.mcp.AddReceivingMiddleware(s.unserved, undeclared)
	s.sync()
	return s
}

// MCP returns the underlying go-sdk server, for transports other than Run's
// (mcp.NewStreamableHTTPHandler, say).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run serves one client over t until the client disconnects or ctx ends;
// over a LineTransport on standard input, until it closes.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	return s.mcp.Run(ctx, t)
}

// sync makes the tools registered with the MCP server those the set has
// active now. Adding or removing tools makes the SDK send
// notifications/tools/list_changed to connected clients.
func (s *Server) sync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var active []string
	for _, t := range s.set.Active() {
		active = append(active, t.Name)
		if !slices.Contains(s.served, t.Name) {
			s.mcp.AddTool(mcpTool(t), s.handler(t.Name))
		}
	}
	var gone []string
	for _, name := range s.served {
		if !slices.Contains(active, name) {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		s.mcp.RemoveTools(gone...)
	}
	s.served = active
}

// unserved answers a tools/call of a tool the server does not serve now —
// one of a skill not loaded, or no tool at all — as the tool set does (a
// tool failure that names the skill to load, or that there is no such
// tool), where the SDK would answer a bare "unknown tool".
func (s *Server) unserved(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if !ok || call.Params == nil {
			return next(ctx, method, req)
		}
		s.mu.Lock()
		served := slices.Contains(s.served, call.Params.Name)
		s.mu.Unlock()
		if served {
			return next(ctx, method, req)
		}
		return s.handler(call.Params.Name)(ctx, call)
	}
}

// undeclared answers a request of a capability the server does not declare
// — logging, resources, prompts, completions — with -32601, as MCP asks,
// where the SDK would serve some of them (prompts/list, an empty list).
func undeclared(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		for _, prefix := range []string{"logging/", "resources/", "prompts/", "completion/"} {
			if strings.HasPrefix(method, prefix) {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: this server declares no " + strings.TrimSuffix(prefix, "/") + " capability"}
			}
		}
		return next(ctx, method, req)
	}
}

func mcpTool(t tools.Tool) *mcp.Tool {
	ro := t.ReadOnly
	closed, destructive := false, !ro
	ann := &mcp.ToolAnnotations{ReadOnlyHint: ro, OpenWorldHint: &closed}
	if !ro {
		ann.DestructiveHint = &destructive
	}
	return &mcp.Tool{
		Name:         t.Name,
		Description:  t.Description,
		InputSchema:  t.InputSchema,
		OutputSchema: t.OutputSchema,
		Annotations:  ann,
	}
}

func (s *Server) handler(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		opts := tools.CallOptions{ToolsChanged: s.sync}
		if id, ok := req.Params.GetMeta()[MetaRunID].(string); ok {
			opts.RunID = id
		}
		if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
			p := s.progress(ctx, req.Session, tok)
			opts.Progress = p.add
			// Every progress of the call is sent before its result.
			defer p.wait()
		}
		return result(s.set.Call(ctx, name, req.Params.Arguments, opts)), nil
	}
}

// progress returns the progress of one call: each run of output is sent as
// a notifications/progress for token, in order, by a goroutine of its own,
// so a client that does not read stalls the sending, never the command.
// While a send waits, what arrives is merged into the last run waiting when
// it is of the same stream, so what waits stays bounded (and a few runs at
// most when the streams take turns). A run longer than
// the set's maxBytes is cut to its end, like bash's own output.
func (s *Server) progress(ctx context.Context, ss *mcp.ServerSession, token any) *progress {
	return &progress{ctx: ctx, ss: ss, token: token, limit: s.set.Config().MaxBytes}
}

// maxPendingRuns bounds the runs of output waiting to be sent for one call.
const maxPendingRuns = 8

type progress struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	token any
	limit int

	mu      sync.Mutex
	sent    int64        // output bytes published so far
	queue   []pendingRun // waiting to be sent, oldest first
	sending bool         // a goroutine is sending the queue
	wg      sync.WaitGroup
}

// pendingRun is output waiting to be sent: its stream, its text (the end
// of it when it was longer than the limit, and how much was cut) and the
// progress value once it is sent.
type pendingRun struct {
	stream string
	text   string
	cut    int
	at     int64
}

func (p *progress) add(r tools.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent += int64(len(r.Text))
	if n := len(p.queue); n > 0 && p.queue[n-1].stream == r.Stream {
		q := &p.queue[n-1]
		q.text += r.Text
		q.at = p.sent
	} else {
		p.queue = append(p.queue, pendingRun{stream: r.Stream, text: r.Text, at: p.sent})
	}
	if len(p.queue) > maxPendingRuns { // streams taking turns: the oldest is dropped, and counted
		p.queue[1].cut += p.queue[0].cut + len(p.queue[0].text)
		p.queue = p.queue[1:]
	}
	for i := range p.queue {
		if q := &p.queue[i]; len(q.text) > p.limit {
			tail := validTail(q.text, p.limit)
			q.cut += len(q.text) - len(tail)
			q.text = tail
		}
	}
	if !p.sending {
		p.sending = true
		p.wg.Add(1)
		go p.send()
	}
}

// send sends the queue until it is empty.
func (p *progress) send() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.sending = false
			p.mu.Unlock()
			return
		}
		r := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		text := r.text
		if r.cut > 0 {
			text = fmt.Sprintf("[… %d bytes not shown]\n", r.cut) + text
		}
		// A progress notification is advice: a client gone away is noticed
		// by the call itself, so a failed send is not an error of the call.
		_ = p.ss.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{
			Meta:          mcp.Meta{MetaStream: r.stream},
			ProgressToken: p.token,
			Progress:      float64(r.at),
			Message:       text,
		})
	}
}

// wait returns once every run added has been sent (or failed to be).
func (p *progress) wait() { p.wg.Wait() }

// validTail returns at most n bytes from the end of s, starting on a rune
// boundary.
func validTail(s string, n int) string {
	i := len(s) - n
	for i < len(s) && i > 0 && s[i]&0xC0 == 0x80 {
		i++
	}
	return s[i:]
}

// result turns a tool result into an MCP result.
func result(r tools.Result) *mcp.CallToolResult {
	out := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: r.Text}},
		StructuredContent: structured(r.Structured),
		IsError:           r.IsError,
	}
	if r.Image != nil {
		out.Content = append(out.Content, &mcp.ImageContent{Data: r.Image.Data, MIMEType: r.Image.MIMEType})
	}
	if r.Commit != nil {
		out.Meta = mcp.Meta{MetaCommit: r.Commit}
	}
	return out
}

// structured returns v as a JSON object for structuredContent, which must be
// one. Every structured result of the tools is a struct pointer, so this only
// guards against a nil.
func structured(v any) any {
	if v == nil {
		return map[string]any{}
	}
	return v
}
