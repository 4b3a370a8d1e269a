package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// Session is one tenant's workspace and the tool set over it. It is safe
// for concurrent use.
type Session struct {
	m        *Manager
	id       string
	tenant   string
	settings Settings
	created  time.Time
	lifetime time.Duration
	idle     time.Duration
	inst     *backend.Instance
	set      *tools.Set
	// dropJournal removes the journal's store (see journalStore).
	dropJournal func() error
	pooled      bool
	// base is the workspace's tree as the session began (Diff).
	base *baseline

	ctx    context.Context // ends when the session does
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	inflight int
	lastUsed time.Time
	closing  bool
	calls    sync.WaitGroup
	detached []*Detached // Detach's calls, oldest first

	closeOnce sync.Once
	closeErr  error
	// leave makes close leave the workspace for another replica
	// (Instance.Leave) rather than remove it: set as the daemon stops.
	leave atomic.Bool
}

// checkTools fails when a tool configuration cannot start a session — an
// always-on skill without its grant — before a workspace is started for it.
// Whether the backend has a shell is known only once it has: until then it
// is taken to have one.
func checkTools(cfg tools.Config, actor scope.Rules) error {
	return toolsError(cfg.Check(tools.Caps{Bash: true, Scope: actor}))
}

// toolsError is a failed tools.Config.Check as a *SettingError: the bad
// option's, or, for what makes a skill unavailable, always's.
func toolsError(err error) error {
	var oe *tools.OptionError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &oe):
		return &SettingError{oe.Option, oe.Reason}
	}
	return &SettingError{"always", err.Error()}
}

// removeTimeout bounds the removal of one workspace.
const removeTimeout = time.Minute

// journalStore makes the store of a session's journal: a private directory
// of the daemon's (mode 0700 in the host's temporary directory), outside
// every backend's workspace — a container's processes cannot reach it — so
// a session's commands cannot choose what the journal restores. drop
// removes it; a crashed daemon's stores stay behind as sandboxd-journal-*.
// Nothing reads a store but the session that made it, which does not
// outlive the daemon, so its writes are not flushed to stable storage
// (fsync cost a journaled write three flushes, most of its time).
func journalStore() (store workspace.FileSystem, drop func() error, err error) {
	dir, err := os.MkdirTemp("", "sandboxd-journal-")
	if err != nil {
		return nil, nil, fmt.Errorf("the session's journal store: %w (set TMPDIR to a writable directory)", err)
	}
	fsys, err := localfs.New(dir, localfs.WithSync(false))
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	return fsys, func() error { return errors.Join(fsys.Close(), os.RemoveAll(dir)) }, nil
}

func (m *Manager) newSession(id, tenant string, st Settings, cfg tools.Config, inst *backend.Instance, lifetime, idle time.Duration, out egress.Policy) (*Session, error) {
	if err := toolsError(cfg.Check(tools.Caps{Bash: inst.Bash != nil, Scope: st.Scope})); err != nil {
		return nil, err
	}
	store, dropJournal, err := journalStore()
	if err != nil {
		return nil, err
	}
	env := tools.Env{
		FS: inst.FS, Bash: inst.Bash,
		Session:      workspace.Session{ID: id, RunID: id, Tenant: tenant, Root: inst.Root, Vars: egressVars(st.Vars, out, inst)},
		Scope:        st.Scope,
		JournalStore: store,
	}
	if m.gateway != nil && cfg.Sources.HTTP() {
		env.Sources = m.gateway.Only(cfg.Sources.Names()...)
	}
	set, err := tools.New(env, cfg)
	if err != nil {
		if derr := dropJournal(); derr != nil {
			m.o.logger.Warn("the session's journal store was not removed", "session", id, "err", derr)
		}
		return nil, err
	}
	now := time.Now()
	s := &Session{
		m: m, id: id, tenant: tenant, settings: st, created: now, lastUsed: now,
		lifetime: lifetime, idle: idle, inst: inst, set: set, dropJournal: dropJournal,
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	return s, nil
}

// ID names the session.
func (s *Session) ID() string { return s.id }

// Tenant names the session's owner.
func (s *Session) Tenant() string { return s.tenant }

// Tools is the session's tool set. Calls made on it directly bypass the
// session's cap of calls in flight and its audit; use Call or Do.
func (s *Session) Tools() *tools.Set { return s.set }

// FS is the session's workspace files, for bulk transfers made within Do.
func (s *Session) FS() workspace.FileSystem { return s.inst.FS }

// Root is the workspace root as commands see it.
func (s *Session) Root() string { return s.inst.Root }

// Done is closed when the session ends; Err then says why.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err is nil while the session lives, and then why it ended (wrapping
// ErrClosed or ErrShuttingDown).
func (s *Session) Err() error { return context.Cause(s.ctx) }

// Info describes a session, as the HTTP API shows it.
type Info struct {
	ID            string     `json:"id"`
	Tenant        string     `json:"tenant"`
	Backend       string     `json:"backend"`
	Root          string     `json:"root"`
	Workspace     string     `json:"workspace"` // the backend's name for it: a container, a directory
	Settings      Settings   `json:"settings"`
	Created       time.Time  `json:"created"`
	LastUsed      time.Time  `json:"lastUsed"`
	ExpiresAt     *time.Time `json:"expiresAt,omitempty"`
	IdleTimeout   Duration   `json:"idleTimeout,omitzero"`
	CallsInFlight int        `json:"callsInFlight"`
	Pooled        bool       `json:"pooled"`
	// Background are the session's background commands (bash with
	// background), running or ended and kept.
	Background []tools.Background `json:"background,omitempty"`
	// Detached are the session's detached calls (Detach), running or
	// ended and kept.
	Detached []CallInfo `json:"detached,omitempty"`
}

// Info returns a snapshot of the session.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := Info{
		ID: s.id, Tenant: s.tenant, Backend: s.m.backend.Name(), Root: s.inst.Root, Workspace: s.inst.ID,
		Settings: s.settings, Created: s.created, LastUsed: s.lastUsed,
		IdleTimeout: Duration(s.idle), CallsInFlight: s.inflight, Pooled: s.pooled,
	}
	if s.lifetime > 0 {
		t := s.created.Add(s.lifetime)
		in.ExpiresAt = &t
	}
	for _, d := range s.detached {
		in.Detached = append(in.Detached, d.info())
	}
	if bg := s.set.Background(); len(bg) > 0 {
		in.Background = bg
	}
	return in
}

// Do runs fn as one call named op in the session: it takes one of the
// session's slots for calls in flight (failing with ErrBusy when none is
// free, and ErrClosed once the session is ending), marks the session used,
// cancels fn's context when the session ends, and reports the call to the
// manager's audit log and observer. fn reports whether the call failed as
// a tool result (failed) or outside the tool (err). A call during which the
// workspace ended by itself ends the session and fails with
// ErrWorkspaceEnded.
func (s *Session) Do(ctx context.Context, op string, fn func(ctx context.Context) (failed bool, err error)) error {
	start := time.Now()
	if err := s.admit(op); err != nil {
		return err
	}
	return s.run(ctx, op, start, fn)
}

// admit takes a slot for a call named op, as Do does, reporting a refusal
// to the observer.
func (s *Session) admit(op string) error {
	err := s.begin()
	if err != nil {
		ev := CallEvent{Tenant: s.tenant, Session: s.id, Tool: op, Outcome: OutcomeBusy}
		if errors.Is(err, ErrClosed) {
			ev.Outcome = OutcomeClosed
		}
		s.m.observe(ev)
	}
	return err
}

// run is Do's work once admit took the call's slot, which run gives back.
func (s *Session) run(ctx context.Context, op string, start time.Time, fn func(ctx context.Context) (failed bool, err error)) error {
	ev := CallEvent{Tenant: s.tenant, Session: s.id, Tool: op}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	failed, err := fn(cctx)
	if errors.Is(err, workspace.ErrUnavailable) {
		settle(ctx, s.inst)
	}
	if s.inst.Ended() {
		// The call failed because the workspace is gone: the session ends
		// now, and the call says so, not the tool's error.
		s.m.lose(s)
	}
	// Whether the session ended while fn ran is decided before the slot is
	// given back: once it is, a draining close goes on to end the session,
	// and a call that finished first must not be reported as cut short.
	interrupted := !stop()
	cancel(nil)
	s.end()
	ev.Duration = time.Since(start)
	switch {
	case interrupted:
		ev.Outcome = OutcomeClosed
		err = fmt.Errorf("%w (during the call)", context.Cause(s.ctx))
	case err != nil:
		ev.Outcome = OutcomeFailed
	case failed:
		ev.Outcome = OutcomeError
	default:
		ev.Outcome = OutcomeOK
	}
	s.m.observe(ev)
	return err
}

// Call runs a tool of the session within Do. The result is the tool's (a
// failure of the tool is a Result with IsError); the error is Do's.
func (s *Session) Call(ctx context.Context, tool string, args json.RawMessage, opts tools.CallOptions) (tools.Result, error) {
	var res tools.Result
	err := s.Do(ctx, tool, s.toolCall(tool, args, opts, &res))
	return res, err
}

// toolCall is the work of Call for Do: it calls the tool, setting *res.
func (s *Session) toolCall(tool string, args json.RawMessage, opts tools.CallOptions, res *tools.Result) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		*res = s.set.Call(ctx, tool, args, opts)
		if e, ok := res.Structured.(*tools.ErrorResult); ok && res.IsError && e.Error == workspace.ErrUnavailable.Name() {
			settle(ctx, s.inst)
		}
		return res.IsError, nil
	}
}

func (s *Session) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch max := s.m.o.maxCalls; {
	case s.closing:
		if cause := context.Cause(s.ctx); cause != nil {
			return fmt.Errorf("%w (session %s)", cause, s.id)
		}
		return fmt.Errorf("%w: %s", ErrClosed, s.id)
	case max > 0 && s.inflight >= max:
		return fmt.Errorf("%w (%d)", ErrBusy, max)
	}
	s.inflight++
	s.calls.Add(1)
	s.lastUsed = time.Now()
	return nil
}

func (s *Session) end() {
	s.mu.Lock()
	s.inflight--
	s.lastUsed = time.Now()
	s.mu.Unlock()
	s.calls.Done()
}

// expired says why the session is over at now, or "".
func (s *Session) expired(now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.lifetime > 0 && now.Sub(s.created) >= s.lifetime:
		return "its lifetime of " + s.lifetime.String() + " is over"
	case s.idle > 0 && s.inflight == 0 && now.Sub(s.lastUsed) >= s.idle:
		return "idle for " + s.idle.String()
	}
	return ""
}

// close ends the session once: no new calls; with drain, the calls in
// flight may finish until ctx ends; then the rest are cancelled and the
// workspace removed. The session must be out of the manager's map.
func (s *Session) close(ctx context.Context, cause error, drain bool) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		idle := make(chan struct{})
		go func() { s.calls.Wait(); close(idle) }()
		if drain {
			select {
			case <-idle:
			case <-ctx.Done():
			}
		}
		s.cancel(cause)
		// Cancelled calls end once their commands are killed; a backend that
		// hangs is not waited for past ctx.
		select {
		case <-idle:
		case <-ctx.Done():
		}
		// Removal happens even when ctx is over: a workspace is never leaked.
		// Background commands are stopped first, their trees killed by
		// the backend, which a removed workspace could no longer do.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
		if err := s.set.Close(rctx); err != nil {
			s.m.o.logger.Warn("the session's background commands did not end in time", "session", s.id, "err", err)
		}
		leaving := s.leave.Load() && s.inst.Leave != nil
		release := s.inst.Close
		if leaving {
			release = s.inst.Leave
		}
		s.closeErr = errors.Join(release(rctx), s.dropJournal(), s.base.close())
		cancel()
		s.m.release(s.tenant)
		if leaving {
			s.m.o.logger.Info("session left to another replica", "tenant", s.tenant, "session", s.id, "workspace", s.inst.ID)
		} else {
			s.m.o.logger.Info("session ended", "tenant", s.tenant, "session", s.id, "reason", cause.Error())
		}
	})
	return s.closeErr
}
