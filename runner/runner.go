// Package runner hosts workspace sessions for many tenants: each session is
// a backend workspace (a hardened container on Docker; a directory or a
// memory tree for development) and a tool set over it (package tools).
//
//	m, err := runner.New(ctx, memory.Backend{}, runner.WithMaxSessions(10))
//	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Grants: []string{"fs.write"}}})
//	res, err := s.Call(ctx, "write", json.RawMessage(`{"path":"a.txt","content":"hi"}`), tools.CallOptions{})
//	err = m.Shutdown(ctx)
//
// The Manager owns the lifecycle: it creates sessions within the operator's
// policy (package policy) and per-tenant cap, ends them after their lifetime
// or idle timeout, caps the calls in flight of each, and at shutdown drains
// the calls in flight and removes every workspace it made — but those that
// outlive its run ([backend.Resumer], [backend.Adopter]) it leaves, unless
// WithEndOnShutdown, and the daemon's next run resumes them. Everything it
// makes carries its owner ([backend.Owner]: host, boot, PID and the PID's
// start time). At start it claims the daemon's name on a shared backend
// ([backend.Claimer]), refusing to start while another run of it lives, and
// asks the backend to reap what ended runs left behind, so a crash leaks
// nothing past the next start and no living run loses anything. A session
// whose workspace dies ends with it (ErrWorkspaceEnded). A warm pool per
// image and profile keeps workspaces started ahead of demand when the
// backend can ([backend.Warmer]), and checks each before it hands it out.
//
// The Manager stands on the [backend.Backend] port alone and imports no
// implementation: the program that makes it picks one (package
// [github.com/sandboxd/sandboxd/backend/docker], backend/local,
// backend/memory, or its own).
//
// Tenants see only their own sessions: Get, List and Delete of another
// tenant's session answer ErrNotFound, as if it did not exist.
package runner

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// Errors of the Manager and its sessions; match them with errors.Is.
var (
	// ErrNotFound: no such session for this tenant.
	ErrNotFound = errors.New("no such session")
	// ErrTooManySessions: the tenant has as many sessions as it may.
	ErrTooManySessions = errors.New("the tenant is at its limit of sessions")
	// ErrBusy: the session has as many calls in flight as it may.
	ErrBusy = errors.New("the session is at its limit of calls in flight")
	// ErrClosed: the session has ended (deleted, expired, shut down).
	ErrClosed = errors.New("the session has ended")
	// ErrShuttingDown: the manager takes no new sessions.
	ErrShuttingDown = errors.New("the daemon is shutting down")
	// ErrWorkspaceEnded: the session's workspace ended by itself (its
	// container was killed or removed from outside), and the session with
	// it. It wraps ErrClosed.
	ErrWorkspaceEnded = fmt.Errorf("%w: its workspace ended", ErrClosed)
	// ErrResultNotKept: a detached call ended, but its result is not kept,
	// or no longer: it was over a session's bytes of results, the memory
	// budget had no room for it (DetachRequest.Hold), a newer result took
	// its place, or it expired (WithDetachedResults). The error says which.
	ErrResultNotKept = errors.New("the detached call's result is not kept")
	// ErrInterrupted: a detached call was accepted by an earlier run of
	// the daemon, which stopped or died before its result could be
	// fetched: the call may have ended, or been cut short, and its result
	// is lost (the session itself was resumed). Retry what it did.
	ErrInterrupted = errors.New("the detached call was interrupted by a restart of the daemon or a pause of its session; its result is lost")
	// ErrPaused: the session is paused (Manager.Pause); Manager.Resume
	// brings it back. It is also why a paused session's calls that were
	// in flight ended.
	ErrPaused = errors.New("the session is paused")
	// ErrNoPause: the backend cannot pause sessions (Instance.Pause).
	ErrNoPause = errors.New("this backend cannot pause sessions")
)

// DefaultImage is the image sessions get when the policy names none.
const DefaultImage = "sandboxd/minimal:latest"

// Outcomes of a call, as CallEvent reports them.
const (
	OutcomeOK     = "ok"     // the tool ran and succeeded
	OutcomeError  = "error"  // the tool ran and reported a failure (isError)
	OutcomeFailed = "failed" // the call failed outside the tool (backend gone)
	OutcomeBusy   = "busy"   // refused: too many calls in flight
	OutcomeClosed = "closed" // refused or cut short: the session ended
)

// CallEvent describes one finished call, for audit logs and metrics. It
// never carries arguments, file contents or command output.
type CallEvent struct {
	Tenant, Session, Tool, Outcome string
	// Call names the call, as the egress records of its commands'
	// connections do ("" for a refused one).
	Call     string
	Duration time.Duration
}

// Option configures New.
type Option func(*options)

type options struct {
	policy         policy.Policy
	tools          tools.Config
	maxSessions    int
	maxCalls       int
	lifetime       Duration
	maxLifetime    Duration
	idle           Duration
	maxIdle        Duration
	workspaceBytes int64
	grants         []string
	pools          []PoolConfig
	daemon         string
	labels         map[string]string
	logger         *slog.Logger
	observe        func(CallEvent)
	sweep          time.Duration
	egress         egress.Policy
	egressOpts     []egress.Option
	secrets        []Secret
	caPEM          []byte
	resultBytes    int64
	resultTTL      time.Duration
	journalStores  JournalStores
	snapshots      *snapshot.Store
	templates      []Template
	endOnShutdown  bool
	autoResume     bool
}

// WithPolicy sets the operator's policy sessions are judged by (default:
// the zero Policy, the hardened profile only, on DefaultImage).
func WithPolicy(p policy.Policy) Option { return func(o *options) { o.policy = p } }

// WithTools sets the tool configuration sessions start from (default
// tools.DefaultConfig()).
func WithTools(c tools.Config) Option { return func(o *options) { o.tools = c } }

// WithMaxSessions caps the sessions of one tenant (default 0, no cap);
// CreateRequest.MaxSessions overrides it for one tenant.
func WithMaxSessions(n int) Option { return func(o *options) { o.maxSessions = n } }

// WithMaxCallsInFlight caps the calls running at once in one session
// (default 8; 0 is no cap).
func WithMaxCallsInFlight(n int) Option { return func(o *options) { o.maxCalls = n } }

// WithLifetime sets a session's default lifetime and the most it may ask
// for (zero: none). A maximum bounds the default too: with a maximum, a
// default of zero or above it is the maximum.
func WithLifetime(def, max time.Duration) Option {
	return func(o *options) { o.lifetime, o.maxLifetime = Duration(def), Duration(max) }
}

// WithIdleTimeout sets a session's default idle timeout and the most it may
// ask for (zero: none), the default bounded as WithLifetime's.
func WithIdleTimeout(def, max time.Duration) Option {
	return func(o *options) { o.idle, o.maxIdle = Duration(def), Duration(max) }
}

// WithWorkspaceBytes bounds a memory workspace's contents (default 0, no
// bound).
func WithWorkspaceBytes(n int64) Option { return func(o *options) { o.workspaceBytes = n } }

// WithGrants lists the grants sessions may ask for (default nil: any).
func WithGrants(grants ...string) Option {
	return func(o *options) { o.grants = append([]string{}, grants...) }
}

// WithPool keeps size started workspaces of an image ready for sessions
// whose profile matches the pool's (the image's default hardened profile).
// It needs a Warmer backend.
func WithPool(p PoolConfig) Option { return func(o *options) { o.pools = append(o.pools, p) } }

// WithDaemonName names this daemon in the labels of what it makes (default
// "sandboxd"). Two daemons sharing one Docker engine need different names:
// New refuses a second run of a name while the first lives
// ([backend.Claimer]). The name is the label [backend.LabelDaemon].
func WithDaemonName(name string) Option { return func(o *options) { o.daemon = name } }

// WithLabels adds labels to everything the backend makes (and to what
// reaping at start looks for). They may name another owner than this
// process ([backend.Owner.Labels]): the one whose end lets a later run reap
// it.
func WithLabels(labels map[string]string) Option {
	return func(o *options) {
		if o.labels == nil {
			o.labels = map[string]string{}
		}
		maps.Copy(o.labels, labels)
	}
}

// WithLogger logs lifecycle events and one audit line per call to l
// (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithObserver calls f after every call, refused ones included. f must be
// quick and safe for concurrent use.
func WithObserver(f func(CallEvent)) Option { return func(o *options) { o.observe = f } }

// WithEgress sets what sessions may reach through their egress proxy
// (package egress; default: nothing, no egress). Each session whose policy
// allows any destination gets a proxy on its workspace's loopback
// (egress.ListenAddr) and HTTP_PROXY and its kin in its commands'
// environment, on backends whose workspace has no network of its own
// (Instance.Accept: docker); local and memory commands use the host's
// network, and get no proxy. A tenant (CreateRequest.Egress) and a
// session (Settings.Egress) may narrow the policy's rules, never widen
// them. opts are passed to every session's proxy (egress.WithResolver, …).
func WithEgress(p egress.Policy, opts ...egress.Option) Option {
	return func(o *options) { o.egress, o.egressOpts = p, opts }
}

// WithDetachedResults bounds the results of a session's detached calls
// (Session.Detach) that the daemon keeps in its memory once their calls
// end: at most bytes of them a session (default
// DefaultDetachedResultBytes; a newer result displaces the oldest), each
// for ttl after its call ended (default DefaultDetachedResultTTL); zero
// keeps a default. A result over bytes on its own is not kept. Each is
// drawn from DetachRequest.Hold as well, the memory budget of whoever
// started the call.
func WithDetachedResults(bytes int64, ttl time.Duration) Option {
	return func(o *options) { o.resultBytes, o.resultTTL = bytes, ttl }
}

// WithSecrets declares the operator's secrets: credentials sessions'
// commands use without holding them (Secret). Each needs a destination
// WithEgress allows; a session gets the secrets of its tenant's
// (Secret.Tenants), or those of them Settings.Secrets names.
func WithSecrets(secrets ...Secret) Option {
	return func(o *options) { o.secrets = append(o.secrets, secrets...) }
}

// WithCACerts adds the PEM certificates of authorities that sessions trust
// — beside their image's and their own (the egress proxy's, for the HTTPS
// it inspects) — and that the daemon's own outbound TLS trusts beside the
// host's: the proxy's connections to the destinations it inspects, and the
// source gateway's. A network that re-signs TLS (a corporate proxy, these
// build machines) needs its authority here for sessions to reach anything.
func WithCACerts(pem []byte) Option {
	return func(o *options) { o.caPEM = append(o.caPEM, pem...) }
}

// JournalStores makes the store of one session's journal (tools.Env's
// JournalStore) and returns how to let go of it once the session has
// ended.
type JournalStores func(req JournalStoreRequest) (store workspace.FileSystem, drop func() error, err error)

// JournalStoreRequest says whose journal a store is for, and where it is
// kept.
type JournalStoreRequest struct {
	// Session names the session.
	Session string
	// Dir, when not empty, is a private directory (mode 0700) that outlives
	// the daemon's run with the session (backend.Instance.StateDir): the
	// store is to be kept there, made if missing, and found there again by
	// the run that resumes the session; drop then only lets go of it (the
	// backend removes Dir with the session), and a journal found damaged
	// there is set aside by the session host, Dir's entries moved out.
	// Empty: the store is the session's alone, and drop removes it.
	Dir string
}

// WithJournalStores gives each session's journal a store of f's: a file
// system the session's commands cannot reach, so that they cannot choose
// what a failed workspace_exec restores (the daemon makes a private
// directory of its own per session). Without it a session's journal is kept
// in memory, lost with the session. A store that cannot be made fails the
// session's creation.
func WithJournalStores(f JournalStores) Option { return func(o *options) { o.journalStores = f } }

// WithSweepInterval sets how often expiry is checked (default 1s).
func WithSweepInterval(d time.Duration) Option { return func(o *options) { o.sweep = d } }

// Manager creates, finds and ends sessions. It is safe for concurrent use.
type Manager struct {
	backend backend.Backend
	o       options
	labels  map[string]string

	mu        sync.Mutex
	sessions  map[string]*Session
	perTenant map[string]int // sessions and reservations
	closing   bool
	pools     []*pool

	stopSweep chan struct{}
	swept     chan struct{}
	// deleting counts sessions Delete took out of the map and is still
	// removing; Shutdown waits for them, so an exit never cuts a removal
	// short (a container gone but its volume left).
	deleting sync.WaitGroup
	// gateway sends the requests of the operator's http sources for every
	// session's shell; nil without them.
	gateway *sources.Gateway
	// roots verify the daemon's own outbound TLS: the host's and
	// WithCACerts'.
	roots *x509.CertPool
	// unclaimFn gives back the backend's claim (backend.Claimer); nil
	// without one.
	unclaimFn func(context.Context) error
	// lost counts the sessions whose workspace ended by itself; ended keeps
	// why, by session ID, for those sessions' later requests.
	lost  uint64
	ended map[string]lostSession
	// egress counts the sessions' egress connections and bytes.
	egress egressCounts
	// adopting is held while a session is taken over from another replica
	// (backend.Adopter), one at a time.
	adopting sync.Mutex
	// snapOps counts snapshot operations by op and outcome (snapOp).
	snapOps map[[2]string]uint64
	// paused are the paused sessions (Pause), by ID; each counts in
	// perTenant.
	paused map[string]*pausedSession
}

// lostSession is a session whose workspace ended by itself.
type lostSession struct {
	tenant  string
	cause   error
	removed chan struct{} // closed once its workspace is removed
}

// maxEnded bounds how many lost sessions a manager remembers.
const maxEnded = 1024

// unclaim gives back the backend's claim, if any.
func (m *Manager) unclaim(ctx context.Context) error {
	if m.unclaimFn == nil {
		return nil
	}
	return m.unclaimFn(ctx)
}

// auditTo writes each request to an http source to the daemon's log.
func auditTo(logger *slog.Logger) func(sources.AuditRecord) {
	return func(r sources.AuditRecord) {
		level := slog.LevelInfo
		if r.Outcome != "sent" {
			level = slog.LevelWarn
		}
		logger.Log(context.Background(), level, "source request", "session", r.Session, "run", r.Run, "source", r.Source,
			"method", r.Method, "url", r.URL, "outcome", r.Outcome, "reason", r.Reason, "status", r.Status,
			"bytes", r.Bytes, "duration", r.Duration)
	}
}

// New returns a Manager over b. Before it returns it claims the daemon's
// name when b is a [backend.Claimer] (failing with
// [backend.ErrDaemonRunning] while another run of it lives), reaps what
// ended runs of the same daemon left behind (an error there fails New),
// resumes the sessions they left when b is a [backend.Resumer] (same IDs,
// settings and expiry; those past their lifetime or idle timeout are
// removed), and starts the warm pools filling in the background.
func New(ctx context.Context, b backend.Backend, opts ...Option) (*Manager, error) {
	o := options{tools: tools.DefaultConfig(), maxCalls: 8, daemon: "sandboxd", sweep: time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.resultBytes < 0 || o.resultTTL < 0 {
		return nil, fmt.Errorf("runner: detached results: %d bytes for %v is less than nothing (limits.detachedResultBytes, limits.detachedResultTTL; 0 is the default)", o.resultBytes, o.resultTTL)
	}
	o.resultBytes = cmp.Or(o.resultBytes, DefaultDetachedResultBytes)
	o.resultTTL = cmp.Or(o.resultTTL, DefaultDetachedResultTTL)
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	// One meaning for an image name: an image definition's name is its image.
	o.policy.DefaultImage = images.Canonical(cmp.Or(o.policy.DefaultImage, DefaultImage))
	o.policy.Images = slices.Clone(o.policy.Images)
	for i, pattern := range o.policy.Images {
		o.policy.Images[i] = images.Canonical(pattern)
	}
	if err := o.tools.Validate(); err != nil {
		return nil, fmt.Errorf("runner: tool configuration: %w", err)
	}
	if err := o.egress.Validate(); err != nil {
		return nil, fmt.Errorf("runner: egress: %w", err)
	}
	if err := validateSecrets(o.secrets, o.egress); err != nil {
		return nil, fmt.Errorf("runner: secrets: %w", err)
	}
	roots, err := trustedRoots(o.caPEM)
	if err != nil {
		return nil, fmt.Errorf("runner: caCerts: %w", err)
	}
	var gateway *sources.Gateway
	if o.tools.Sources.HTTP() {
		gopts := []sources.GatewayOption{sources.WithAudit(auditTo(o.logger))}
		if len(o.caPEM) > 0 {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
			gopts = append(gopts, sources.WithTransport(tr))
		}
		if gateway, err = sources.NewGateway(o.tools.Sources, gopts...); err != nil {
			return nil, fmt.Errorf("runner: sources: %w", err)
		}
	}
	labels := backend.Self().Labels()
	maps.Copy(labels, o.labels)
	labels[policy.LabelSandboxd], labels[backend.LabelDaemon] = "1", o.daemon
	m := &Manager{
		backend: b, o: o,
		gateway:   gateway,
		roots:     roots,
		labels:    labels,
		sessions:  map[string]*Session{},
		ended:     map[string]lostSession{},
		paused:    map[string]*pausedSession{},
		perTenant: map[string]int{},
		stopSweep: make(chan struct{}),
		swept:     make(chan struct{}),
	}
	if c, ok := b.(backend.Claimer); ok {
		release, err := c.Claim(ctx, backend.Spec{Profile: policy.Profile{Image: o.policy.DefaultImage}, Labels: maps.Clone(m.labels)})
		if err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
		m.unclaimFn = release
	}
	// The owner's labels are left out: Reap looks for every run's.
	n, err := b.Reap(ctx, m.selector())
	if err != nil {
		m.unclaim(ctx)
		return nil, fmt.Errorf("runner: reaping what an earlier run left: %w", err)
	}
	if n > 0 {
		o.logger.Info("reaped workspaces of an earlier run", "backend", b.Name(), "count", n)
	}
	if r, ok := b.(backend.Resumer); ok {
		m.resume(ctx, r)
	}
	if err := m.makeTemplates(ctx); err != nil {
		m.unclaim(ctx)
		return nil, err
	}
	for _, pc := range o.pools {
		p, err := m.newPool(pc)
		if err != nil {
			m.closePools(ctx)
			m.unclaim(ctx)
			return nil, err
		}
		m.pools = append(m.pools, p)
	}
	go m.sweepLoop()
	return m, nil
}

// Backend returns the manager's backend.
func (m *Manager) Backend() backend.Backend { return m.backend }

// CreateRequest asks for a session.
type CreateRequest struct {
	// Tenant owns the session. Required.
	Tenant string
	// Settings are the session's settings.
	Settings Settings
	// MaxSessions, when positive, is this tenant's cap instead of the
	// manager's.
	MaxSessions int
	// MaxSecrets is how many secrets of its own (Settings.SecretValues)
	// this tenant's sessions may bring; zero allows none.
	MaxSecrets int
	// Source, when set, is a host directory whose contents the workspace
	// starts with (Spec.Source). It is for the operator's own tools — the
	// command line's --workspace — and must never come from a tenant. A
	// session with a Source never gets a pooled workspace.
	Source string
	// Egress, when not nil, is this tenant's egress rules: the operator's
	// (WithEgress) narrowed, as Settings.Egress narrows them further.
	Egress []string

	// from, for a fork, is the snapshot its tree comes from, and forkOf
	// the session it is a fork of.
	from   origin
	forkOf string
}

// Create starts a session. It fails with a *policy.DeniedError naming the
// setting when the settings ask for what the policy forbids, a
// *SettingError for settings that cannot be used, ErrTooManySessions at
// the tenant's cap, and ErrShuttingDown once Shutdown has begun. A session
// whose profile matches a warm pool gets a workspace from it; each pooled
// workspace goes to exactly one session.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*Session, error) {
	if req.Tenant == "" {
		return nil, errors.New("runner: CreateRequest.Tenant is required")
	}
	st := req.Settings
	id := randomID("s-")
	r, err := m.resolve(id, req)
	if err != nil {
		return nil, err
	}
	if err := m.reserve(req.Tenant, cmp.Or(req.MaxSessions, m.o.maxSessions)); err != nil {
		return nil, err
	}
	spec := m.spec(r.profile, r.tools)
	spec.Session, spec.Tenant, spec.Source = id, req.Tenant, req.Source
	inst, pooled, filled := m.claim(ctx, spec, r.from.template)
	if inst == nil {
		if inst, err = m.backend.Open(ctx, spec); err != nil {
			m.release(req.Tenant)
			return nil, fmt.Errorf("runner: starting the workspace: %w", err)
		}
	}
	if inst.Bash == nil { // resolve took it to run commands
		if err := toolsError(r.tools.Check(tools.Caps{Scope: st.Scope})); err != nil {
			inst.Close(context.WithoutCancel(ctx))
			m.release(req.Tenant)
			return nil, err
		}
	}
	if r.from.set() && !filled {
		err := m.fill(ctx, inst, r.from)
		m.snapOp("restore", err)
		if err != nil {
			inst.Close(context.WithoutCancel(ctx))
			m.release(req.Tenant)
			return nil, err
		}
		r.from = r.from.made()
	}
	s, err := m.newSession(id, req.Tenant, st, r.tools, inst, r.lifetime, r.idle, r.out, nil)
	if err != nil {
		inst.Close(context.WithoutCancel(ctx))
		m.release(req.Tenant)
		return nil, err
	}
	s.pooled, s.forkOf, s.tenantEgress = pooled, req.forkOf, req.Egress
	s.base = m.baselineOf(s, r.from)
	if err := m.publish(ctx, s, req.Egress); err != nil {
		s.close(context.WithoutCancel(ctx), fmt.Errorf("%w: %w", ErrClosed, err), false)
		return nil, err
	}
	if err := m.track(ctx, s); err != nil {
		return nil, err
	}
	m.o.logger.Info("session created", "tenant", req.Tenant, "session", id, "backend", m.backend.Name(), "workspace", inst.ID, "pooled", pooled)
	return s, nil
}

// resolved is a session's request as Create judged it: all it needs before
// it reserves a place for the session and starts its workspace.
type resolved struct {
	lifetime, idle time.Duration
	tools          tools.Config
	profile        policy.Profile
	out            sessionOut
	// from is where the workspace's first tree comes from (origin).
	from origin
}

// resolve judges a request in one step, in this order, before anything is
// reserved or started: the lifetime and idle timeout within the operator's
// bounds; the tool configuration within the operator's (toolsConfig:
// options, grants, sources, vars); the actor's scope, and whether each
// always-on skill can be active (tools.Config.Check, the workspace taken
// to run commands until it has started: Create checks again one that does
// not); the container profile the policy gives; the egress policy
// and the secrets; the snapshot or template the tree comes from, which
// must exist. The first failure is returned.
func (m *Manager) resolve(id string, req CreateRequest) (resolved, error) {
	st := req.Settings
	var r resolved
	var err error
	if r.lifetime, err = bounded("lifetime", st.Lifetime, m.o.lifetime, m.o.maxLifetime); err != nil {
		return r, err
	}
	if r.idle, err = bounded("idleTimeout", st.IdleTimeout, m.o.idle, m.o.maxIdle); err != nil {
		return r, err
	}
	if r.tools, err = toolsConfig(m.o.tools, st, m.o.grants); err != nil {
		return r, err
	}
	if err := st.Scope.Validate(); err != nil {
		return r, &SettingError{"scope", err.Error()}
	}
	if err := toolsError(r.tools.Check(tools.Caps{Bash: true, Scope: st.Scope})); err != nil {
		return r, err
	}
	if r.profile, err = m.o.policy.Apply(st.request(id, req.Tenant)); err != nil {
		return r, err
	}
	r.out.tenantRules = req.Egress
	if r.out.policy, err = egressPolicy(m.o.egress, req.Egress, st.Egress); err != nil {
		return r, err
	}
	if r.out.secrets, err = m.sessionSecrets(req.Tenant, st.Secrets, nil); err != nil {
		return r, err
	}
	if r.out.secrets, err = tenantSecrets(r.out.secrets, st.SecretValues, req.MaxSecrets, r.out.policy); err != nil {
		return r, err
	}
	r.from, err = m.origin(req, st)
	return r, err
}

// track adds s, whose workspace is ready, to the manager's sessions and
// serves it: its egress proxy, and the watch that ends it with its
// workspace. It fails with ErrShuttingDown, s closed, once Shutdown has
// begun, and with the egress's error, s closed, when egress cannot be
// served as its secrets need.
func (m *Manager) track(ctx context.Context, s *Session) error {
	// Before anyone can reach the session; it ends with it.
	if err := s.eg.start(ctx); err != nil {
		s.close(context.WithoutCancel(ctx), fmt.Errorf("%w: %w", ErrClosed, err), false)
		return err
	}
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		s.close(context.WithoutCancel(ctx), ErrShuttingDown, false)
		return ErrShuttingDown
	}
	m.sessions[s.id] = s
	m.mu.Unlock()
	if inst := s.inst; inst.Done != nil {
		go func() {
			select {
			case <-inst.Done:
				m.lose(s)
			case <-s.ctx.Done():
			}
		}()
	}
	return nil
}

// spec is the backend spec of a profile under the manager's settings.
func (m *Manager) spec(prof policy.Profile, cfg tools.Config) backend.Spec {
	return backend.Spec{
		Profile: prof, EnvAllow: cfg.BashEnvAllow, InheritEnv: cfg.BashInheritEnv,
		MaxBytes: m.o.workspaceBytes, Labels: maps.Clone(m.labels),
	}
}

// settle waits, up to settleGrace or until ctx ends, for inst to be known
// as ended, and reports whether it is. A call that failed as Unavailable may
// have seen the workspace's stream break a moment before the backend has
// said why (it asks the engine how the container ended); settling first
// lets the call say that the session ended, not that the backend stumbled.
func settle(ctx context.Context, inst *backend.Instance) bool {
	if inst.Done == nil {
		return false
	}
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-inst.Done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return inst.Ended()
}

// settleGrace bounds how long a call that failed as Unavailable waits for
// its workspace to be known as ended. Generous: the engine is asked how the
// container ended, and on a loaded host that can take seconds.
const settleGrace = 10 * time.Second

func randomID(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:16])
}

// reserve counts a session against the tenant's cap before it is started,
// so that concurrent creates cannot pass the cap.
func (m *Manager) reserve(tenant string, max int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return ErrShuttingDown
	}
	if max > 0 && m.perTenant[tenant] >= max {
		return fmt.Errorf("%w (%d)", ErrTooManySessions, max)
	}
	m.perTenant[tenant]++
	return nil
}

func (m *Manager) release(tenant string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.perTenant[tenant]--; m.perTenant[tenant] <= 0 {
		delete(m.perTenant, tenant)
	}
}

// Get returns the tenant's session id. For a paused one (Pause) it fails
// with ErrPaused, naming how to resume it — or, WithAutoResume, resumes it
// first (bounded by a minute). It fails with the cause, wrapping
// ErrWorkspaceEnded, for a session whose workspace ended by itself (up to
// 1024 such are remembered), and with ErrNotFound for any other it does not
// have. On a backend that replicas of the daemon share
// ([backend.Adopter]), a session this run does not hold is looked for
// there and taken over (bounded by a minute): its settings, tenant,
// creation time and expiry come with it; its journal's history, diff
// baseline, background commands and detached calls, which lived with the
// run that held it, do not.
func (m *Manager) Get(tenant, id string) (*Session, error) {
	m.mu.Lock()
	s := m.sessions[id]
	if s != nil && s.tenant == tenant {
		m.mu.Unlock()
		if !s.inst.Ended() || s.inst.Err == nil || !errors.Is(s.inst.Err(), backend.ErrMoved) {
			return s, nil
		}
		// Another replica took it over, and the watch that forgets it here
		// has not run yet: forget it now, and take it back.
		m.lose(s)
		m.mu.Lock()
		s = nil
	}
	if p := m.paused[id]; s == nil && p != nil && p.tenant == tenant {
		m.mu.Unlock()
		return m.getPaused(p)
	}
	err := m.gone(tenant, id)
	_, lost := m.ended[id]
	m.mu.Unlock()
	ad, ok := m.backend.(backend.Adopter)
	if s != nil || lost || !ok {
		return nil, err
	}
	return m.adopt(ad, tenant, id, err)
}

// gone is why the tenant has no session id; m.mu is held.
func (m *Manager) gone(tenant, id string) error {
	if l, ok := m.ended[id]; ok && l.tenant == tenant {
		return l.cause
	}
	return fmt.Errorf("%w: %s", ErrNotFound, id)
}

// lose ends s, whose workspace ended by itself: its calls fail at once
// with ErrWorkspaceEnded and the workspace's cause, its workspace is
// removed in the background, and later requests for it are told why it
// ended. It does nothing for a session already ending. It returns the
// cause calls are told — also when another goroutine's lose got there
// first and has not yet cancelled the session's context — or nil when the
// session ended otherwise.
func (m *Manager) lose(s *Session) error {
	why := "no cause given"
	if s.inst.Err != nil && s.inst.Err() != nil {
		if err := s.inst.Err(); errors.Is(err, backend.ErrMoved) {
			cause := fmt.Errorf("%w (%w); ask again to take it back", workspace.ErrUnavailable, err)
			m.moved(s, cause)
			return cause
		}
		why = s.inst.Err().Error()
	}
	cause := fmt.Errorf("%w: %s", ErrWorkspaceEnded, why)
	m.mu.Lock()
	if m.sessions[s.id] != s {
		defer m.mu.Unlock()
		if l, ok := m.ended[s.id]; ok && l.tenant == s.tenant {
			return l.cause
		}
		return nil
	}
	delete(m.sessions, s.id)
	if len(m.ended) >= maxEnded {
		for id := range m.ended { // any one: the map keeps a bounded memory
			delete(m.ended, id)
			break
		}
	}
	removed := make(chan struct{})
	m.ended[s.id] = lostSession{tenant: s.tenant, cause: cause, removed: removed}
	m.lost++
	m.deleting.Add(1) // under mu, as in Delete
	m.mu.Unlock()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.cancel(cause)
	m.o.logger.Warn("session's workspace ended", "tenant", s.tenant, "session", s.id, "workspace", s.inst.ID, "cause", why)
	go func() {
		defer m.deleting.Done()
		defer close(removed)
		ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
		defer cancel()
		if err := s.close(ctx, cause, false); err != nil {
			m.o.logger.Warn("removing a lost session's workspace failed", "tenant", s.tenant, "session", s.id, "error", err)
		}
	}()
	return cause
}

// List returns the tenant's sessions, oldest first.
func (m *Manager) List(tenant string) []*Session {
	m.mu.Lock()
	var out []*Session
	for _, s := range m.sessions {
		if s.tenant == tenant {
			out = append(out, s)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b *Session) int {
		return cmp.Or(a.created.Compare(b.created), cmp.Compare(a.id, b.id))
	})
	return out
}

// Delete ends the tenant's session id: calls in flight are cancelled (their
// commands killed), and the workspace is removed (a paused one's too). It fails as Get does for
// a session the tenant does not have; for one whose workspace ended by
// itself it returns once that workspace is removed — or, on a backend that
// retries a removal the engine refused (backend.Remover), once that
// removal is queued — and forgets the session.
func (m *Manager) Delete(ctx context.Context, tenant, id string) error {
	if _, ok := m.backend.(backend.Adopter); ok {
		// Another replica's session is taken over, then deleted here.
		if _, err := m.Get(tenant, id); err != nil && !errors.Is(err, ErrClosed) {
			return err
		}
	}
	if p := m.pausedFor(tenant, id); p != nil {
		return m.deletePaused(ctx, p)
	}
	m.mu.Lock()
	s := m.sessions[id]
	if s == nil || s.tenant != tenant {
		err := m.gone(tenant, id)
		l, lost := m.ended[id]
		lost = lost && l.tenant == tenant
		if lost {
			delete(m.ended, id)
		}
		m.mu.Unlock()
		if lost {
			select { // its workspace is removed when Delete returns
			case <-l.removed:
			case <-ctx.Done():
			}
		}
		return err
	}
	delete(m.sessions, id)
	m.deleting.Add(1) // under mu: Shutdown, which takes mu first, then sees it
	m.mu.Unlock()
	defer m.deleting.Done()
	return s.close(ctx, fmt.Errorf("%w: deleted", ErrClosed), false)
}

// Stats is a snapshot of the manager, for metrics.
type Stats struct {
	// Sessions counts the live sessions by tenant; Paused the paused ones
	// (Pause), which Sessions does not count.
	Sessions map[string]int
	Paused   int
	// Pools describes each warm pool.
	Pools []PoolStats
	// Lost counts the sessions that ended because their workspace did (a
	// container killed or removed from outside).
	Lost uint64
	// Egress counts the sessions' egress connections.
	Egress EgressStats
	// Snapshots describes the snapshot store; nil without one.
	Snapshots *SnapshotStats
	// Removals describes the backend's retried removals of closed
	// workspaces (backend.Remover); zero for a backend without them.
	Removals backend.RemovalStats
}

// Stats returns a snapshot of the sessions and pools.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	st := Stats{Sessions: map[string]int{}, Lost: m.lost, Egress: m.egress.stats(), Paused: len(m.paused)}
	for _, s := range m.sessions {
		st.Sessions[s.tenant]++
	}
	pools := slices.Clone(m.pools)
	m.mu.Unlock()
	for _, p := range pools {
		st.Pools = append(st.Pools, p.stats())
	}
	st.Snapshots = m.snapshotStats()
	if r, ok := m.backend.(backend.Remover); ok {
		st.Removals = r.Removals()
	}
	return st
}

// WaitRemovals returns once the backend retries no removal of a closed
// workspace (backend.Remover: the engine refused it at first), or with
// ctx's error when ctx ends first. For a backend that retries none it
// returns nil at once.
func (m *Manager) WaitRemovals(ctx context.Context) error {
	r, ok := m.backend.(backend.Remover)
	if !ok {
		return nil
	}
	return r.WaitRemovals(ctx)
}

// removalWait bounds how long Shutdown waits for the backend's retried
// removals.
const removalWait = time.Minute

// Shutdown stops taking sessions, lets the calls in flight finish until ctx
// ends (then cancels them), and removes every workspace the manager made,
// pooled ones included — but a session's workspace that outlives the
// daemon's run (Instance.Leave: another replica of the daemon may take it
// over, or its next run resume it) is left, with its session and its
// background commands, unless WithEndOnShutdown. It returns once all are
// removed or left, with the errors of those that could not be; removals
// the backend retries are waited for up to a minute, or until ctx ends.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return nil
	}
	m.closing = true
	all := slices.Collect(maps.Values(m.sessions))
	clear(m.sessions)
	m.mu.Unlock()
	close(m.stopSweep)
	<-m.swept

	// Where other replicas share the sessions (Instance.Leave), each is
	// left to them: its calls end, its workspace lives on, and the next
	// request for it, through any replica, takes it over.
	errs := make([]error, len(all)+1)
	var wg sync.WaitGroup
	left := 0
	for i, s := range all {
		if s.inst.Leave != nil && !m.o.endOnShutdown {
			s.leave.Store(true)
			left++
		}
		wg.Go(func() { errs[i] = s.close(ctx, ErrShuttingDown, true) })
	}
	errs[len(all)] = m.closePools(ctx)
	wg.Wait()
	m.deleting.Wait()
	paused, err := m.shutdownPaused(ctx)
	errs = append(errs, err)
	left += paused
	// Removals the engine refused are retried, a minute at most.
	wctx, cancel := context.WithTimeout(ctx, removalWait)
	errs = append(errs, m.WaitRemovals(wctx))
	cancel()
	m.o.logger.Info("runner stopped", "sessions", len(all), "left_running", left)
	return errors.Join(append(errs, m.unclaim(ctx))...)
}

func (m *Manager) sweepLoop() {
	defer close(m.swept)
	t := time.NewTicker(m.o.sweep)
	defer t.Stop()
	for {
		select {
		case <-m.stopSweep:
			return
		case now := <-t.C:
			m.expire(now)
		}
	}
}

// expire ends the sessions past their lifetime or idle timeout at now, and
// forgets the detached calls' results past their time.
func (m *Manager) expire(now time.Time) {
	type ending struct {
		s   *Session
		why string
	}
	var due []ending
	var freed []func()
	m.mu.Lock()
	for id, s := range m.sessions {
		if why := s.expired(now); why != "" {
			delete(m.sessions, id)
			due = append(due, ending{s, why})
		}
		freed = append(freed, s.expireResults(now, m.o.resultTTL)...)
	}
	m.mu.Unlock()
	giveBack(freed)
	m.expirePaused(now)
	for _, e := range due {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := e.s.close(ctx, fmt.Errorf("%w: %s", ErrClosed, e.why), false); err != nil {
			m.o.logger.Warn("removing an expired session failed", "tenant", e.s.tenant, "session", e.s.id, "error", err)
		}
		cancel()
	}
}

func (m *Manager) observe(ev CallEvent) {
	m.o.logger.Info("tool call", "tenant", ev.Tenant, "session", ev.Session, "call", ev.Call, "tool", ev.Tool,
		"outcome", ev.Outcome, "duration_ms", float64(ev.Duration.Microseconds())/1000)
	if m.o.observe != nil {
		m.o.observe(ev)
	}
}
