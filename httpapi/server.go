// Package httpapi serves a runner.Manager's sessions over HTTP: a JSON API
// under /v1, MCP over streamable HTTP at /mcp, health and readiness probes,
// Prometheus metrics, and the OpenAPI document that describes it all
// (/openapi.json, checked in as openapi.json).
//
//	m, _ := runner.New(ctx, memory.Backend{}, runner.WithObserver(metrics.Observe))
//	srv, _ := httpapi.New(m, httpapi.WithTenants(tenants), httpapi.WithMetrics(metrics))
//	http.ListenAndServe("127.0.0.1:7878", srv)
//
// Every /v1 route and /mcp need a tenant's bearer token ("Authorization:
// Bearer …"); tokens are configured as SHA-256 hashes (HashToken) and
// compared in constant time. /metrics needs a metrics token
// (WithMetricsTokens), as it shows every tenant's activity. No token or a
// bad one is 401; another tenant's session is 404, as if it did not exist; a
// cap reached is 429; a body over its limit is 413; the daemon's memory
// budget for requests in flight spent is 503 with Retry-After. An engine
// that does not answer (backend.ErrUnreachable) is 503 Unavailable, and a
// draining server (Drain) answers new requests 503 ShuttingDown: every 503
// carries Retry-After. Errors are JSON: {"error": KIND, "message": …}.
//
// # Memory
//
// What a request makes the daemon hold is bounded by design: JSON bodies
// are capped (WithMaxBodyBytes) and, with the file buffers of uploads and
// downloads, drawn from one budget of bytes in flight (WithMemoryBudget);
// upload archives wait on disk; bash output waits in a buffer of
// tools.ProgressCap a stream, so a client that does not read its event
// stream slows the command; and every response write has a deadline
// (WithWriteTimeout): a client that takes nothing for that long has its
// connection closed and its call canceled.
//
// Tool calls answer what MCP answers: {"content": [...], "structuredContent":
// {...}, "isError": bool}. A call whose request accepts text/event-stream is
// answered as server-sent events instead: "output" events with bash's output
// while the command runs, then one "result" event.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/workspace"
)

// Server is the daemon's HTTP handler. It is safe for concurrent use.
type Server struct {
	m      *runner.Manager
	o      options
	auth   *authenticator
	mux    *http.ServeMux
	mcp    *mcpHandler
	idle   idleState // requests in flight, and the drain (health.go)
	budget *semaphore.Weighted
	shares sync.Map // tenant name → *semaphore.Weighted, its share of budget
	// resultShares: tenant name → *semaphore.Weighted, what its detached
	// calls' kept results may hold of its share (resultHold).
	resultShares sync.Map
	scrapers     *authenticator // the metrics tokens
}

// Option configures New.
type Option func(*options)

type options struct {
	tenants     []Tenant
	logger      *slog.Logger
	metrics     *Metrics
	maxBody     int64
	maxTransfer int64
	version     string
	minRate     int64         // body bytes per second a client must keep up, after grace
	grace       time.Duration // how long a body may take before minRate applies
	schema      []byte        // the configuration's JSON Schema
	budget      int64         // bytes requests in flight may hold
	writeWait   time.Duration // how long one response write may block
	scrapers    []string      // hashes of the metrics tokens
}

// WithTenants sets the tenants and their tokens. Without tenants every
// request needing a token is refused.
func WithTenants(t []Tenant) Option { return func(o *options) { o.tenants = append(o.tenants, t...) } }

// WithConfigSchema serves schema, the JSON Schema of the daemon's
// configuration file, at GET /v1/config.schema.json, without a token, so
// that editors can check a file against the daemon they will run it on.
// Without it that path answers 404.
func WithConfigSchema(schema []byte) Option { return func(o *options) { o.schema = schema } }

// WithLogger logs requests that fail on the server's side (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithMetrics serves m at /metrics; pass m.Observe to runner.WithObserver so
// that it sees every call. Default: a Metrics of its own, which counts no
// calls.
func WithMetrics(m *Metrics) Option { return func(o *options) { o.metrics = m } }

// WithMaxBodyBytes caps a JSON request body (default 64 MiB: a write may
// carry a file of maxFileBytes). Over it is 413.
func WithMaxBodyBytes(n int64) Option { return func(o *options) { o.maxBody = n } }

// WithMaxTransferBytes caps an upload's tar stream and a download's file
// contents (default 256 MiB). Over it is 413, with nothing written.
func WithMaxTransferBytes(n int64) Option { return func(o *options) { o.maxTransfer = n } }

// WithMinBodyRate bounds how slowly a client may send a request body: after
// grace, it must have sent at least rate bytes for every second since the
// body began, or the read fails and the connection is closed. This stops a
// client that drips a body a byte at a time from holding a connection and a
// goroutine for ever, without cutting a long upload that keeps pace
// (default 4 KiB/s after 10 s; rate 0 turns it off).
func WithMinBodyRate(rate int64, grace time.Duration) Option {
	return func(o *options) { o.minRate, o.grace = rate, grace }
}

// WithMemoryBudget bounds the bytes that requests in flight and the kept
// results of detached calls may hold at once, all tenants together, and
// one tenant to half of it (default 512 MiB; at least 2×bodyWeight times
// the body cap): each JSON body counts bodyWeight times its size (its
// bytes, their decoded form, the tool's copy), each file an upload writes
// or a download sends counts its size while it is in memory, a detached
// call's answer twice its result's size while it is written. A request
// that would pass the budget is 503 with Retry-After, before its response
// begins. A detached call's result counts its size for as long as the
// runner keeps it (runner.WithDetachedResults), a tenant's kept results at
// most a quarter of the budget; one with no room is not kept, and its call
// says so (ResultNotKept). It does not count what a tool holds of its own
// while it runs (bash's output up to maxFileBytes, a read's file): the
// session options' ceilings bound those.
func WithMemoryBudget(n int64) Option { return func(o *options) { o.budget = n } }

// WithWriteTimeout bounds how long a client may leave one write of a
// response untaken (default 30 s): every write of at most writeChunk bytes
// — an event, a piece of a download — gets that long, so a client must take
// 64 KiB every 30 s. A client that does not has its connection closed and
// the call it waits on canceled; streams that are merely idle are not cut.
func WithWriteTimeout(d time.Duration) Option { return func(o *options) { o.writeWait = d } }

// WithMetricsTokens sets the hashes (HashToken) of the bearer tokens that
// may read /metrics. Without any, /metrics answers 401 to everyone: its
// counters describe every tenant's activity, so a tenant's token is not
// enough.
func WithMetricsTokens(hashes ...string) Option {
	return func(o *options) { o.scrapers = append(o.scrapers, hashes...) }
}

// WithVersion sets the version the MCP server reports.
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// New returns the handler of m's sessions. It fails when a tenant is
// misconfigured (no name, a token that is not "sha256:" and 64 hex digits).
func New(m *runner.Manager, opts ...Option) (*Server, error) {
	o := options{maxBody: 64 << 20, maxTransfer: 256 << 20, version: "devel", minRate: 4 << 10, grace: 10 * time.Second,
		budget: 512 << 20, writeWait: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.metrics == nil {
		o.metrics = NewMetrics()
	}
	auth, err := newAuthenticator(o.tenants)
	if err != nil {
		return nil, err
	}
	if o.budget/2 < bodyWeight*o.maxBody {
		return nil, fmt.Errorf("httpapi: the memory budget (limits.memoryBudgetBytes, %d) must be at least %d times the body cap (limits.maxBodyBytes, %d), or a tenant's share could not hold a largest body", o.budget, 2*bodyWeight, o.maxBody)
	}
	scrapers, err := newAuthenticator([]Tenant{{Name: "metrics", Tokens: o.scrapers}})
	if err != nil {
		return nil, fmt.Errorf("httpapi: metrics tokens: %w", err)
	}
	s := &Server{m: m, o: o, auth: auth, mux: http.NewServeMux(), budget: semaphore.NewWeighted(o.budget), scrapers: scrapers}
	s.mcp = newMCPHandler(s)
	for _, r := range s.routes() {
		h := r.handler
		if r.auth {
			h = s.authenticate(h)
		}
		s.mux.Handle(r.method+" "+r.pattern, h)
	}
	return s, nil
}

// route is one entry of the API; routes lists them all, and a test checks
// each against the OpenAPI document.
type route struct {
	method, pattern string
	auth            bool
	handler         http.Handler
}

func (s *Server) routes() []route {
	f := func(h func(http.ResponseWriter, *http.Request)) http.Handler { return http.HandlerFunc(h) }
	return []route{
		{"GET", "/healthz", false, f(s.healthz)},
		{"GET", "/readyz", false, f(s.readyz)},
		{"GET", "/metrics", false, s.authenticateWith(s.scrapers, f(s.metrics))},
		{"GET", "/openapi.json", false, f(serveOpenAPI)},
		{"GET", "/v1/config.schema.json", false, f(s.configSchema)},
		{"POST", "/v1/sessions", true, f(s.createSession)},
		{"GET", "/v1/sessions", true, f(s.listSessions)},
		{"GET", "/v1/sessions/{id}", true, f(s.getSession)},
		{"DELETE", "/v1/sessions/{id}", true, f(s.deleteSession)},
		{"GET", "/v1/sessions/{id}/tools", true, f(s.listTools)},
		{"POST", "/v1/sessions/{id}/tools/{tool}", true, f(s.callTool)},
		{"GET", "/v1/sessions/{id}/calls/{call}", true, f(s.getCall)},
		{"POST", "/v1/sessions/{id}/provider-run", true, f(s.beginProviderRun)},
		{"POST", "/v1/sessions/{id}/provider-run/end", true, f(s.endProviderRun)},
		{"PUT", "/v1/sessions/{id}/files/{path...}", true, f(s.upload)},
		{"GET", "/v1/sessions/{id}/files/{path...}", true, f(s.download)},
		{"GET", "/v1/sessions/{id}/diff", true, f(s.diff)},
		{"POST", "/v1/sessions/{id}/baseline", true, f(s.baseline)},
		{"POST", "/v1/sessions/{id}/snapshots", true, f(s.createSnapshot)},
		{"POST", "/v1/sessions/{id}/fork", true, f(s.forkSession)},
		{"POST", "/v1/sessions/{id}/pause", true, f(s.pauseSession)},
		{"POST", "/v1/sessions/{id}/resume", true, f(s.resumeSession)},
		{"GET", "/v1/snapshots", true, f(s.listSnapshots)},
		{"GET", "/v1/snapshots/{id}", true, f(s.getSnapshot)},
		{"DELETE", "/v1/snapshots/{id}", true, f(s.deleteSnapshot)},
		{"GET", "/v1/templates", true, f(s.listTemplates)},
		{"GET", "/v1/sessions/{id}/egress", true, f(s.getEgress)},
		{"PUT", "/v1/sessions/{id}/egress", true, f(s.putEgress)},
		{"POST", "/mcp", true, s.mcp},
		{"GET", "/mcp", true, s.mcp},
		{"DELETE", "/mcp", true, s.mcp},
	}
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter(w, r) {
		return
	}
	defer s.leave(r)
	if s.o.minRate > 0 && r.Body != nil && r.Body != http.NoBody {
		r.Body = &paceReader{body: r.Body, rc: http.NewResponseController(w), start: time.Now(), rate: s.o.minRate, grace: s.o.grace}
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	l := &lease{budget: s.budget}
	defer l.release()
	ctx = context.WithValue(ctx, leaseKey{}, l)
	if r.Body != nil && r.Body != http.NoBody && r.Method != http.MethodPut {
		// Every body but an upload's (which waits on disk, see upload) is
		// read into memory, by decode or by /mcp's server: capped, and
		// drawn from the budget as it arrives.
		r.Body = &leasedReader{ReadCloser: http.MaxBytesReader(w, r.Body, s.o.maxBody), l: l, weight: bodyWeight}
	}
	if s.o.writeWait > 0 {
		d := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), wait: s.o.writeWait, cancel: cancel}
		// A fresh deadline at the start, for what net/http writes on its own
		// (the headers of a response with no body), and at the end, for
		// what it writes after the handler: never one a connection kept
		// alive still has from an earlier response.
		d.extend()
		defer d.extend()
		w = d
	}
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

// writeChunk is the most one deadline of a deadlineWriter covers.
const writeChunk = 64 << 10

// errSlowClient cancels the call of a client that stopped taking its
// response.
var errSlowClient = errors.New("the client took none of its response for the write timeout (http.writeTimeout): connection closed, call canceled")

// deadlineWriter gives every write of a response, in pieces of writeChunk,
// and every flush, a deadline of wait from its start. The first write that
// fails cancels the request's context, so the call behind a stream a client
// stopped reading ends instead of waiting on it; later writes fail at once.
type deadlineWriter struct {
	http.ResponseWriter
	rc     *http.ResponseController
	wait   time.Duration
	cancel context.CancelCauseFunc
	err    error
}

// extend sets the connection's write deadline to wait from now; an error
// means the connection takes no deadlines (HTTP/2 in tests): none then.
func (d *deadlineWriter) extend() { d.rc.SetWriteDeadline(time.Now().Add(d.wait)) }

func (d *deadlineWriter) Write(p []byte) (int, error) {
	n := 0
	for d.err == nil && n < len(p) {
		d.extend()
		m, err := d.ResponseWriter.Write(p[n:min(len(p), n+writeChunk)])
		n += m
		d.failed(err)
	}
	return n, d.err
}

// Flush sends what is buffered, under the same deadline.
func (d *deadlineWriter) Flush() {
	if d.err == nil {
		d.extend()
		d.failed(d.rc.Flush())
	}
}

func (d *deadlineWriter) failed(err error) {
	if err != nil && d.err == nil {
		d.err = err
		d.cancel(writeFailure(d))
	}
}

// writeFailure returns why a write of w's response failed (errSlowClient
// when a deadline passed), or nil.
func writeFailure(w http.ResponseWriter) error {
	if d, ok := w.(*deadlineWriter); ok && d.err != nil {
		return fmt.Errorf("%w: %v", errSlowClient, d.err)
	}
	return nil
}

// Unwrap lets http.ResponseController reach the connection.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// lease is what one request holds of the server's memory budget, and of
// its tenant's share of it once authenticate has bound it; ServeHTTP gives
// it all back when the request ends.
type lease struct {
	budget *semaphore.Weighted
	tenant *semaphore.Weighted // nil until bound
	held   atomic.Int64
}

type leaseKey struct{}

// leaseOf returns the request's lease.
func leaseOf(ctx context.Context) *lease {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok {
		return l
	}
	return &lease{budget: semaphore.NewWeighted(math.MaxInt64)}
}

// tenantShare returns the semaphore of tenant's share of the budget: half
// of it, so that one tenant's flood of requests leaves room for others'.
func (s *Server) tenantShare(tenant string) *semaphore.Weighted {
	return s.share(&s.shares, tenant, s.o.budget/2)
}

// share returns tenant's semaphore in shares, one of size n made on first
// use.
func (s *Server) share(shares *sync.Map, tenant string, n int64) *semaphore.Weighted {
	if sem, ok := shares.Load(tenant); ok {
		return sem.(*semaphore.Weighted)
	}
	sem, _ := shares.LoadOrStore(tenant, semaphore.NewWeighted(n))
	return sem.(*semaphore.Weighted)
}

// bind charges the lease to a tenant's share from now on; a lease that
// already holds bytes stays as it is.
func (l *lease) bind(share *semaphore.Weighted) {
	if l.held.Load() == 0 {
		l.tenant = share
	}
}

// errMemory is the memory budget spent: 503 with Retry-After.
var errMemory = errors.New("the daemon's memory budget (limits.memoryBudgetBytes) is held by requests in flight and detached calls' kept results")

// take holds n more bytes of the budget, or fails at once with errMemory.
func (l *lease) take(n int64) error {
	if n <= 0 {
		return nil
	}
	if l.tenant != nil && !l.tenant.TryAcquire(n) {
		return fmt.Errorf("%w: this tenant holds its share (half), and %d bytes more were asked for; retry shortly", errMemory, n)
	}
	if !l.budget.TryAcquire(n) {
		if l.tenant != nil {
			l.tenant.Release(n)
		}
		return fmt.Errorf("%w: %d bytes more were asked for; retry shortly", errMemory, n)
	}
	l.held.Add(n)
	return nil
}

// resultHold is the memory budget a detached call of tenant's draws on
// while its result is kept (runner.DetachRequest.Hold): its tenant's share
// and the budget, as a request, but for as long as the runner keeps the
// result; and at most half the tenant's share for all its kept results, so
// that the tenant's requests (fetching those results among them) always
// have room.
func (s *Server) resultHold(tenant string) delivery.Hold {
	kept := s.share(&s.resultShares, tenant, s.o.budget/4)
	return func(_ context.Context, n int64) (func(), error) {
		if !kept.TryAcquire(n) {
			return nil, fmt.Errorf("this tenant's kept results hold the most they may, %d bytes (a quarter of limits.memoryBudgetBytes)", s.o.budget/4)
		}
		l := &lease{budget: s.budget, tenant: s.tenantShare(tenant)}
		if err := l.take(n); err != nil {
			kept.Release(n)
			return nil, err
		}
		return func() { l.release(); kept.Release(n) }, nil
	}
}

// put gives back n bytes taken.
func (l *lease) put(n int64) {
	if n > 0 {
		l.held.Add(-n)
		l.budget.Release(n)
		if l.tenant != nil {
			l.tenant.Release(n)
		}
	}
}

func (l *lease) release() { l.put(l.held.Swap(0)) }

// bodyWeight is how many times a JSON body's size it holds in memory: its
// bytes, their decoded form and a tool's copy (a write's content).
const bodyWeight = 3

// leasedReader is a request body that takes weight budget bytes for every
// byte read; a read that finds the budget spent fails with errMemory.
type leasedReader struct {
	io.ReadCloser
	l      *lease
	weight int64
}

func (r *leasedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if lerr := r.l.take(int64(n) * r.weight); lerr != nil {
		return 0, lerr
	}
	return n, err
}

// paceReader is a request body that must keep a minimum pace: before each
// read it sets the connection's read deadline to the moment by which the
// bytes read so far were due, plus the grace period.
type paceReader struct {
	body  io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	rate  int64
	grace time.Duration
	read  int64
}

func (p *paceReader) Read(b []byte) (int, error) {
	due := p.start.Add(p.grace + time.Duration(p.read)*time.Second/time.Duration(p.rate))
	p.rc.SetReadDeadline(due) // an error means the writer cannot take deadlines (HTTP/2 tests): no pace then
	n, err := p.body.Read(b)
	p.read += int64(n)
	if err == io.EOF {
		// The body is done: lift the deadline, or the server's watch for a
		// closed connection would take it for one and cancel the request
		// (an SSE stream, say) later. After a missed deadline it stays, so
		// the server cannot drain the rest of a dripping body either, and
		// closes the connection.
		p.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (p *paceReader) Close() error {
	p.rc.SetReadDeadline(time.Time{})
	return p.body.Close()
}

// errNoScrapers answers /metrics when no metrics token is configured.
var errNoScrapers = errors.New("/metrics needs a metrics token: add its hash to metricsTokens in the daemon's configuration (sandboxd token new)")

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	s.o.metrics.write(w, s.m.Stats())
}

// sessionInfo is a session as the API shows it: runner.Info.
type sessionList struct {
	Sessions []runner.Info `json:"sessions"`
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	t := tenantOf(r)
	var st runner.Settings
	if !s.decode(w, r, &st) {
		return
	}
	sess, err := s.m.Create(r.Context(), runner.CreateRequest{Tenant: t.Name, Settings: st, MaxSessions: t.MaxSessions, MaxSecrets: t.MaxSecrets, Egress: t.Egress})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sessions/"+sess.ID())
	writeJSON(w, http.StatusCreated, sess.Info())
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	out := sessionList{Sessions: s.m.Sessions(tenantOf(r).Name)}
	if out.Sessions == nil {
		out.Sessions = []runner.Info{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	info, err := s.m.Describe(tenantOf(r).Name, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Delete(r.Context(), tenantOf(r).Name, r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// session finds the request's session for its tenant, or answers 404.
func (s *Server) session(w http.ResponseWriter, r *http.Request) (*runner.Session, bool) {
	sess, err := s.m.Get(tenantOf(r).Name, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return nil, false
	}
	return sess, true
}

// decode reads a JSON body (of at most maxBody bytes, see ServeHTTP) into v, strictly;
// an empty body leaves v as it is. It answers 400 or 413 itself.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(r.Body) // capped and leased by ServeHTTP

	if err != nil {
		s.fail(w, r, err)
		return false
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), "request body: "+strings.TrimPrefix(err.Error(), "json: "))
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), "request body: more than one JSON value")
		return false
	}
	return true
}

// errorBody is every error response.
type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// writeError answers an error; a 503 always carries Retry-After.
func writeError(w http.ResponseWriter, status int, kind, msg string) {
	retryLater(w, status)
	writeJSON(w, status, errorBody{Error: kind, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// classify maps an error to its status and kind.
func classify(err error) (int, string) {
	var de *policy.DeniedError
	var se *runner.SettingError
	var mbe *http.MaxBytesError
	var te *tooLargeError
	switch {
	case errors.Is(err, runner.ErrNotFound), errors.Is(err, snapshot.ErrNotFound):
		return http.StatusNotFound, "NotFound"
	case errors.Is(err, runner.ErrNoSnapshots):
		return http.StatusNotImplemented, "SnapshotsOff"
	case errors.Is(err, snapshot.ErrCorrupt):
		return http.StatusUnprocessableEntity, "SnapshotCorrupt"
	case errors.Is(err, snapshot.ErrInvalid):
		return http.StatusUnprocessableEntity, "SnapshotInvalid"
	case errors.Is(err, snapshot.ErrLimit):
		return http.StatusInsufficientStorage, "SnapshotLimit"
	case errors.Is(err, snapshot.ErrNoSpace):
		return http.StatusInsufficientStorage, "NoSpace"
	case errors.Is(err, runner.ErrTooManySessions):
		return http.StatusTooManyRequests, "TooManySessions"
	case errors.Is(err, runner.ErrBusy):
		return http.StatusTooManyRequests, "Busy"
	case errors.Is(err, runner.ErrShuttingDown):
		return http.StatusServiceUnavailable, "ShuttingDown"
	case errors.Is(err, backend.ErrUnreachable):
		return http.StatusServiceUnavailable, workspace.ErrUnavailable.Name()
	case errors.Is(err, errMemory):
		return http.StatusServiceUnavailable, "Overloaded"
	case errors.Is(err, runner.ErrPaused):
		return http.StatusConflict, "Paused"
	case errors.Is(err, runner.ErrNoPause):
		return http.StatusNotImplemented, "PauseOff"
	case errors.Is(err, runner.ErrClosed):
		return http.StatusGone, "SessionEnded"
	case errors.Is(err, runner.ErrResultNotKept):
		return http.StatusGone, "ResultNotKept"
	case errors.Is(err, runner.ErrInterrupted):
		return http.StatusGone, "Interrupted"
	case errors.As(err, &de):
		return http.StatusForbidden, workspace.ErrForbidden.Name()
	case errors.As(err, &se):
		return http.StatusBadRequest, workspace.ErrInvalidArgument.Name()
	case errors.As(err, &mbe), errors.As(err, &te):
		return http.StatusRequestEntityTooLarge, "TooLarge"
	}
	if k := workspace.KindOf(err); k != nil {
		switch k {
		case workspace.ErrNotFound:
			return http.StatusNotFound, k.Name()
		case workspace.ErrUnavailable:
			return http.StatusBadGateway, k.Name()
		case workspace.ErrFileTooLarge:
			return http.StatusRequestEntityTooLarge, k.Name()
		case workspace.ErrTimeout:
			return http.StatusGatewayTimeout, k.Name()
		case workspace.ErrNoSpace:
			return http.StatusInsufficientStorage, k.Name()
		}
		return http.StatusBadRequest, k.Name()
	}
	return http.StatusInternalServerError, "Internal"
}

// fail answers err; errors of the server's own are logged.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, kind := classify(err)
	if status == http.StatusInternalServerError || status == http.StatusBadGateway {
		s.o.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "tenant", tenantOf(r).Name, "error", err)
	}
	switch {
	case errors.Is(err, backend.ErrUnreachable):
		w.Header().Set("Retry-After", engineRetry)
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, status, kind, err.Error())
}

// tooLargeError is a transfer over its cap, found while reading it.
type tooLargeError struct{ what string }

func (e *tooLargeError) Error() string { return e.what }

func tooLarge(format string, a ...any) error { return &tooLargeError{fmt.Sprintf(format, a...)} }
