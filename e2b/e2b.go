// Package e2b serves E2B's sandbox API over a runner.Manager's sessions, so
// that E2B's SDKs, and the agent frameworks built on them, run unchanged
// against sandboxd: the control plane (POST /sandboxes, list, get, kill,
// timeout, connect, pause, resume) under a path prefix, and the in-sandbox
// daemon's API (envd: the Process and Filesystem Connect services, /files,
// /health) on every request that names its sandbox in the E2b-Sandbox-Id
// header, as the SDK sends them when E2B_SANDBOX_URL is set.
//
//	srv, _ := e2b.New(m, e2b.WithAuth(keys), e2b.WithTemplates(map[string]e2b.Template{"base": {Image: "dev"}}))
//	mux.Handle("/e2b/", http.StripPrefix("/e2b", srv.Control())) // E2B_API_URL=http://HOST/e2b
//	// and, first, every request IsEnvd names to srv.Envd():      E2B_SANDBOX_URL=http://HOST
//
// It is a translation, not a second implementation of sessions: a sandbox
// is a session of its API key's tenant, made by Manager.Create with the
// tenant's policy, ceilings and budgets; its commands run through
// Session.Exec (the session's container, its agent, the same hardening,
// limits and process-tree kill), its files through the session's
// FileSystem under the same path guard as every tool. The sandbox's ID is
// the session's. E2B's home directory, /home/user, is the workspace root:
// a relative path is taken from it, and an absolute path outside it is
// refused as outside the workspace.
//
// A sandbox's ports are served by Ports, on the hosts E2B's SDK builds
// (PORT-SANDBOXID.DOMAIN), for the tenants the operator allows.
//
// A sandbox pauses and resumes where the runner's backend can
// (Manager.Pause, Resume; see pause.go): its record, kept here, outlives
// its pauses.
//
// What E2B has and this server does not (pause on a backend that cannot,
// metrics, logs, template builds, egress rules by CIDR) is answered with
// E2B's error shape and 501, "not supported by this server", never
// accepted and ignored.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/workspace"
)

// EnvdVersion is the envd version the server reports: the SDK enables
// features by it (stdin for commands from 0.3.0, the default user from
// 0.4.0).
const EnvdVersion = "0.4.1"

// Home is E2B's home directory, which is the workspace root here.
const Home = "/home/user"

// Tenant is whom an API key acts for: a tenant of the daemon, with its cap
// of sessions and its narrowing of the operator's egress
// (runner.CreateRequest).
type Tenant struct {
	Name        string
	MaxSessions int
	Egress      []string
}

// Auth finds the tenant of an E2B API key; ok is false for a key it does
// not know. It must compare in constant time.
type Auth func(apiKey string) (t Tenant, ok bool)

// Template is what an E2B template name starts a sandbox from: an image (a
// definition's name such as "dev", or a reference), and optionally an
// operator's prepared tree (runner.WithTemplates) to fill its workspace.
type Template struct {
	Image    string
	Template string
}

// Option configures New.
type Option func(*options)

type options struct {
	auth       Auth
	templates  map[string]Template
	logger     *slog.Logger
	domain     string
	maxMessage int
	grants     []string
	ports      func(tenant string) bool
	portConns  int // WithPortConnections
}

// WithAuth sets how API keys are judged. Without it every control-plane
// request is 401.
func WithAuth(a Auth) Option { return func(o *options) { o.auth = a } }

// WithTemplates names the templates sandboxes may be created from (default:
// "base", the dev image). A name it lacks is 404, as E2B answers.
func WithTemplates(t map[string]Template) Option { return func(o *options) { o.templates = t } }

// WithLogger logs what fails on the server's side (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithDomain is the domain the server returns at create, from which the SDK
// builds a port's host (PORT-ID.DOMAIN); default none.
func WithDomain(d string) Option { return func(o *options) { o.domain = d } }

// WithMaxMessageBytes caps one Connect message, in either direction
// (default 8 MiB; connect answers resource_exhausted over it).
func WithMaxMessageBytes(n int) Option { return func(o *options) { o.maxMessage = n } }

// Server serves E2B's API. It is safe for concurrent use.
type Server struct {
	m     *runner.Manager
	o     options
	ctl   *http.ServeMux
	envd  *http.ServeMux
	proxy *httputil.ReverseProxy // of Ports

	mu        sync.Mutex
	boxes     map[string]*sandbox          // each sandbox's last run, a paused one's too
	tokens    map[[sha256.Size]byte]string // a secure sandbox's ID by its token's hash
	portConns map[string]int               // open requests to each tenant's ports
	sweeping  atomic.Bool
}

// New returns the server of m's sessions.
func New(m *runner.Manager, opts ...Option) (*Server, error) {
	o := options{templates: map[string]Template{"base": {Image: "dev"}}, maxMessage: 8 << 20,
		grants: []string{"fs.write", "shell.exec"}, portConns: DefaultPortConnections}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{m: m, o: o, ctl: http.NewServeMux(), envd: http.NewServeMux(), boxes: map[string]*sandbox{}, tokens: map[[sha256.Size]byte]string{}, portConns: map[string]int{}}
	s.controlRoutes()
	s.proxy = s.newPortProxy()
	copts := []connect.HandlerOption{connect.WithReadMaxBytes(o.maxMessage), connect.WithSendMaxBytes(o.maxMessage)}
	s.envd.Handle(processconnect.NewProcessHandler(&processService{s}, copts...))
	s.envd.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s}, copts...))
	s.envd.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.envd.HandleFunc("GET /files", s.download)
	s.envd.HandleFunc("POST /files", s.upload)
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, "not supported by this server: envd "+r.Method+" "+r.URL.Path)
	})
	return s, nil
}

// SandboxHeader names the sandbox of an envd request.
const SandboxHeader = "E2b-Sandbox-Id"

// TokenHeader carries a secure sandbox's envd access token.
const TokenHeader = "X-Access-Token"

// IsEnvd reports whether r is an envd request: one that names its sandbox,
// or carries a sandbox's access token, which names it too (the SDK's
// Sandbox.connect sends envd requests without E2b-Sandbox-Id), or is a
// signed /files URL, whose signature does.
func IsEnvd(r *http.Request) bool {
	return r.Header.Get(SandboxHeader) != "" || r.Header.Get(TokenHeader) != "" || isSigned(r)
}

// ServeHTTP serves both APIs at one root: a request that names a sandbox
// (IsEnvd) on a path of envd's is envd's, any other the control plane's
// (its path without the prefix it is mounted at: /sandboxes, …). The SDK
// names the sandbox on some control-plane calls too (connect), so a
// server that mounts the control plane under a prefix should route by the
// prefix first, to Control, and only then by IsEnvd, to Envd.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.envd.Handler(r); IsEnvd(r) && pattern != "/" {
		s.serveEnvd(w, r)
		return
	}
	s.ctl.ServeHTTP(w, r)
}

// Control is the control plane alone: /sandboxes, … at its root.
func (s *Server) Control() http.Handler { return s.ctl }

// Envd is the in-sandbox API alone, for requests that name their sandbox.
func (s *Server) Envd() http.Handler { return http.HandlerFunc(s.serveEnvd) }

// serveEnvd finds the request's sandbox and checks its access token before
// anything else sees the request.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request) {
	id, token, signed := r.Header.Get(SandboxHeader), r.Header.Get(TokenHeader), isSigned(r)
	switch {
	case id != "":
	case token != "":
		if id = s.byToken(token); id == "" {
			writeError(w, http.StatusUnauthorized, "the access token (X-Access-Token) is no running sandbox's; name the sandbox in E2b-Sandbox-Id")
			return
		}
	case signed:
		if id = s.bySignature(r); id == "" {
			writeError(w, http.StatusUnauthorized, "invalid signature: it is no running secure sandbox's")
			return
		}
	default:
		writeError(w, http.StatusBadRequest, "an envd request names its sandbox: E2b-Sandbox-Id")
		return
	}
	box, err := s.box(id)
	if err != nil {
		// The SDK takes a 502 from envd for a sandbox that is gone or
		// paused (is_running: false).
		msg := fmt.Sprintf("sandbox %q is not running (it was killed, timed out or never existed)", id)
		if errors.Is(err, runner.ErrPaused) {
			msg = err.Error()
		}
		writeError(w, http.StatusBadGateway, msg)
		return
	}
	switch {
	case box.token == "":
	case signed && token == "":
		if why := checkSigned(r, box); why != "" {
			writeError(w, http.StatusUnauthorized, why)
			return
		}
	default:
		if subtle.ConstantTimeCompare([]byte(token), []byte(box.token)) != 1 {
			writeError(w, http.StatusUnauthorized, "this sandbox is secure: its envd access token (X-Access-Token) is required")
			return
		}
	}
	if u, ok := userOf(r); ok && u != "" && u != "user" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("user %q: not supported by this server: every command and file operation runs as the sandbox's one unprivileged user (\"user\")", u))
		return
	}
	s.envd.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), boxKey{}, box)))
}

type boxKey struct{}

func boxOf(ctx context.Context) *sandbox { return ctx.Value(boxKey{}).(*sandbox) }

// userOf is the user an envd request asks to act as: the Basic
// authorization's user (Connect calls) or the username parameter (/files).
func userOf(r *http.Request) (string, bool) {
	if u, _, ok := r.BasicAuth(); ok {
		return u, true
	}
	if q := r.URL.Query(); q.Has("username") {
		return q.Get("username"), true
	}
	return "", false
}

// record is what E2B knows of a sandbox beyond what the runner keeps. It
// outlives the sandbox's pauses: each run of the sandbox — its creation,
// then each resume, which makes its session again — is a sandbox over the
// same record, so its access tokens, metadata, env vars and template are
// those it was created with.
type record struct {
	id       string
	tenant   string
	template string
	metadata map[string]string
	envs     map[string]string
	token    string // the envd access token; "" when not secure
	traffic  string // the traffic access token of its ports; "" when its traffic is public
	started  time.Time

	// autoPause makes the sandbox's timeout pause it rather than end it
	// (pause.go: setEnd): end is then its timeout, which timer keeps.
	autoPause bool
	runs      atomic.Int64 // how many runs it has had
	mu        sync.Mutex
	end       time.Time
	timer     *time.Timer
}

// sandbox is one run of an E2B sandbox: its record, the session it runs
// as, and what lives as long as that session (its processes, watchers).
// The session of a paused sandbox's last run is the one its pause ended.
type sandbox struct {
	*record
	sess     *runner.Session
	run      int64 // its number among the record's runs, from 1
	procs    *procTable
	watchers watchers

	// homeMu guards home: whether Home is the workspace root's own
	// directory in the container (the dev image links it there), asked
	// once, by the first command that starts in the workspace.
	homeMu sync.Mutex
	home   *bool
}

// newRun is a run of rec as sess.
func newRun(rec *record, sess *runner.Session) *sandbox {
	b := &sandbox{record: rec, sess: sess, run: rec.runs.Add(1)}
	b.procs = newProcTable(b)
	return b
}

// homeIsRoot reports whether Home and the workspace root are one directory
// inside the sandbox's container, asking it (one command) the first time.
func (b *sandbox) homeIsRoot(ctx context.Context) (bool, error) {
	b.homeMu.Lock()
	defer b.homeMu.Unlock()
	if b.home != nil {
		return *b.home, nil
	}
	res, err := b.sess.Exec(ctx, "e2b.process", workspace.Command{
		Argv: []string{"/bin/sh", "-c", `[ "$0" -ef "$1" ]`, Home, b.sess.Root()}, Timeout: time.Minute})
	if err != nil {
		return false, err
	}
	same := res.ExitCode == 0
	b.home = &same
	return same, nil
}

// box returns the running sandbox id: a paused one is ErrPaused, one this
// server does not have ErrNotFound.
func (s *Server) box(id string) (*sandbox, error) {
	b, paused, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	if paused != nil {
		return nil, pausedError(id)
	}
	return b, nil
}

// tenantBox is box of the tenant's sandbox id; another tenant's is
// ErrNotFound, as if it did not exist.
func (s *Server) tenantBox(tenant, id string) (*sandbox, error) {
	b, paused, err := s.tenantLookup(tenant, id)
	if err != nil {
		return nil, err
	}
	if paused != nil {
		return nil, pausedError(id)
	}
	return b, nil
}

// tenantLookup is lookup of the tenant's sandbox id; another tenant's is
// ErrNotFound, as if it did not exist.
func (s *Server) tenantLookup(tenant, id string) (*sandbox, *runner.Info, error) {
	b, paused, err := s.lookup(id)
	if err != nil || b.tenant != tenant {
		return nil, nil, notFound(id)
	}
	return b, paused, nil
}

func notFound(id string) error { return fmt.Errorf("%w: %s", runner.ErrNotFound, id) }

// pausedError is what a request that needs sandbox id running is told
// while it is paused.
func pausedError(id string) error {
	return fmt.Errorf("%w: sandbox %s: connect to it to resume it (Sandbox.connect, POST /sandboxes/%s/connect)", runner.ErrPaused, id, id)
}

// lookup returns the sandbox id as it is now: its last run, and the
// runner's description of it when it is paused (the run's session is then
// the one the pause ended). A sandbox whose session was resumed by
// another way (POST /v1/sessions/ID/resume) gets a run of the resumed
// session; one whose session is gone is forgotten, ErrNotFound.
func (s *Server) lookup(id string) (*sandbox, *runner.Info, error) {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil {
		return nil, nil, notFound(id)
	}
	if b.sess.Err() == nil {
		return b, nil, nil
	}
	// Its pause ended the session: is it paused still, resumed, or gone
	// (deleted, or past its lifetime, while paused)? Asked a few times,
	// for a session paused again meanwhile.
	for range 3 {
		if !errors.Is(b.sess.Err(), runner.ErrPaused) {
			break
		}
		info, err := s.m.Describe(b.tenant, id)
		if err != nil {
			break
		}
		if info.State == runner.StatePaused {
			return b, &info, nil
		}
		sess, err := s.m.Get(b.tenant, id)
		if errors.Is(err, runner.ErrPaused) {
			continue
		}
		if err != nil {
			break
		}
		if b, err = s.rerun(b, sess); err != nil {
			return nil, nil, err
		}
		return b, nil, nil
	}
	s.forget(b)
	return nil, nil, notFound(id)
}

// track keeps b, a sandbox's first run.
func (s *Server) track(b *sandbox) {
	s.mu.Lock()
	s.boxes[b.id] = b
	if b.token != "" {
		s.tokens[sha256.Sum256([]byte(b.token))] = b.id
	}
	s.mu.Unlock()
	s.watch(b)
}

// rerun makes a run of old's sandbox as sess, its session resumed, and
// keeps it; when another request made one first, it is that one.
func (s *Server) rerun(old *sandbox, sess *runner.Session) (*sandbox, error) {
	s.mu.Lock()
	cur := s.boxes[old.id]
	if cur != old {
		s.mu.Unlock()
		if cur == nil {
			return nil, notFound(old.id)
		}
		return cur, nil
	}
	b := newRun(old.record, sess)
	s.boxes[b.id] = b
	s.mu.Unlock()
	s.watch(b)
	return b, nil
}

// watch stops b's processes once its session ends, and forgets the
// sandbox unless a pause ended it.
func (s *Server) watch(b *sandbox) {
	go func() {
		<-b.sess.Done()
		b.procs.closeAll()
		if !errors.Is(b.sess.Err(), runner.ErrPaused) {
			s.forget(b)
		}
	}()
}

// forget drops b's sandbox, unless a later run of it is kept.
func (s *Server) forget(b *sandbox) {
	s.mu.Lock()
	if s.boxes[b.id] != b {
		s.mu.Unlock()
		return
	}
	delete(s.boxes, b.id)
	if b.token != "" {
		delete(s.tokens, sha256.Sum256([]byte(b.token)))
	}
	s.mu.Unlock()
	b.stopTimer()
}

// sweep forgets the paused sandboxes whose sessions are gone (deleted or
// past their lifetime while paused, through the runner), one sweep at a
// time.
func (s *Server) sweep() {
	if !s.sweeping.CompareAndSwap(false, true) {
		return
	}
	defer s.sweeping.Store(false)
	s.mu.Lock()
	var ended []string
	for id, b := range s.boxes {
		if b.sess.Err() != nil {
			ended = append(ended, id)
		}
	}
	s.mu.Unlock()
	for _, id := range ended {
		s.lookup(id)
	}
}

// byToken is the ID of the sandbox whose access token is token, or "". It
// looks up the token's hash, so its time says nothing of the token; the
// token is then compared in constant time as every request's is.
func (s *Server) byToken(token string) string {
	if token == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[sha256.Sum256([]byte(token))]
}

func newToken() string { return "ea_" + strings.ToLower(rand.Text()) }

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeError answers an error in E2B's shape; a 503 carries Retry-After.
func writeError(w http.ResponseWriter, status int, msg string) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// errNotSupported is what this server does not do of E2B's.
var errNotSupported = errors.New("not supported by this server")
