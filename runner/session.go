package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/egress"
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
	// eg is its egress; nil where commands use the host's network.
	eg *sessionEgress
	// dropJournal removes the journal's store (see journalStore).
	dropJournal func() error
	pooled      bool
	// forkOf is the session this one is a fork of ("" for none);
	// tenantEgress the tenant's egress rules it was made with
	// (CreateRequest.Egress), which its forks get.
	forkOf       string
	tenantEgress []string
	// base is the tree Diff compares with: the workspace's as the session
	// began, or as a new baseline found it (Rebaseline), which replaces
	// it under baseMu; changes keeps that read apart from the calls that
	// may change the workspace.
	base    *baseline
	baseMu  sync.RWMutex
	changes changeGate
	// state is the directory of what the session keeps beside its record
	// (backend.Instance.StateDir: its journal, its first tree), "" for
	// none; lost says what a resumed or adopted session did not get back.
	state string
	lost  []string

	ctx    context.Context // ends when the session does
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	inflight int
	lastUsed time.Time
	closing  bool
	calls    sync.WaitGroup
	detached []*Detached // Detach's calls running or with their results kept, oldest first
	gone     []*Detached // ended calls whose results are no longer kept, oldest first
	// interrupted are the IDs of the detached calls an earlier run of the
	// daemon, or the session before its pause, accepted (ErrInterrupted),
	// oldest first; interruptedBy says which ("the session was paused").
	interrupted   []string
	interruptedBy string
	// publishing serialises the writes of the session's record (publish).
	publishing sync.Mutex
	// keptBytes is what the kept results of detached hold; resultsDropped
	// is set as the session ends, when they are given back.
	keptBytes      int64
	resultsDropped bool

	closeOnce sync.Once
	closeErr  error
	// leave makes close leave the workspace for another run of the daemon
	// — a replica, or its next run (Instance.Leave) — rather than remove
	// it: set as the daemon stops.
	leave atomic.Bool
	// pausing makes close pause the workspace (Instance.Pause) rather
	// than remove it; pausedWS is then the paused workspace — after a
	// pause that failed (pauseErr), what brings it back running —, and
	// pausedBackground the background commands as the pause ended them.
	pausing          atomic.Bool
	pausedWS         *backend.Paused
	pauseErr         error
	pausedBackground []tools.Background
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

// journalStore makes the store of a session's journal with the store
// WithJournalStores gives, kept in the session's state directory when it
// has one, or none: the journal is then kept in memory
// (tools.Env.JournalStore nil).
func (m *Manager) journalStore(id, state string) (store workspace.FileSystem, drop func() error, err error) {
	if m.o.journalStores == nil {
		return nil, func() error { return nil }, nil
	}
	req := JournalStoreRequest{Session: id}
	if state != "" {
		req.Dir = filepath.Join(state, journalDir)
	}
	return m.o.journalStores(req)
}

// sessionOut is what a session's egress starts from: the policy, the
// tenant's rules that narrowed it (its ceiling for SetEgress), and its
// secrets.
type sessionOut struct {
	policy      egress.Policy
	tenantRules []string
	secrets     []sessionSecret
}

// newSession makes the session of a workspace started (or taken over) for
// it, with the tool configuration its request was judged to have (Create's
// resolve, adopt's record): it judges nothing again.
func (m *Manager) newSession(id, tenant string, st Settings, cfg tools.Config, inst *backend.Instance, lifetime, idle time.Duration, out sessionOut, past *tools.PastBackground) (*Session, error) {
	var state string
	if inst.StateDir != nil {
		var err error
		if state, err = inst.StateDir(id); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	}
	store, dropJournal, err := m.journalStore(id, state)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	s := &Session{
		m: m, id: id, tenant: tenant, settings: st, created: now, lastUsed: now,
		lifetime: lifetime, idle: idle, inst: inst, dropJournal: dropJournal, state: state,
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.eg = m.newSessionEgress(s, out.policy, out.tenantRules, out.secrets)
	env := tools.Env{
		FS: inst.FS, Bash: inst.Bash,
		Session:      workspace.Session{ID: id, RunID: id, Tenant: tenant, Root: inst.Root, Vars: sessionVars(st.Vars, out.secrets)},
		Scope:        st.Scope,
		JournalStore: store,
		Gate:         s.gate,
		// An activated skill is in the record before load_skill answers.
		SkillsChanged:  func(ctx context.Context) error { return m.publish(ctx, s, s.tenantEgress) },
		PastBackground: past,
	}
	if s.eg != nil {
		env.Egress = s.eg
	}
	if m.gateway != nil && cfg.Sources.HTTP() {
		env.Sources = m.gateway.Only(cfg.Sources.Names()...)
	}
	if s.set, err = tools.New(env, cfg); err != nil {
		s.cancel(err)
		if derr := dropJournal(); derr != nil {
			m.o.logger.Warn("the session's journal store was not removed", "session", id, "err", derr)
		}
		return nil, err
	}
	return s, nil
}

// sessionVars are the variables of a session's commands: its settings',
// and its secrets' placeholders and git configuration (secretVars), which
// the settings' cannot replace.
func sessionVars(vars map[string]string, secrets []sessionSecret) map[string]string {
	sv := secretVars(secrets)
	if len(sv) == 0 {
		return vars
	}
	out := maps.Clone(vars)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, sv)
	return out
}

// ID names the session.
func (s *Session) ID() string { return s.id }

// settingsNow returns the session's settings.
func (s *Session) settingsNow() Settings {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settings
}

// Tenant names the session's owner.
func (s *Session) Tenant() string { return s.tenant }

// Tools is the session's tool set. Calls made on it directly bypass the
// session's cap of calls in flight and its audit; use Call or Do.
func (s *Session) Tools() *tools.Set { return s.set }

// FS is the session's workspace files, for bulk transfers made within Do.
// A change made through it outside Do calls BeforeChange first.
func (s *Session) FS() workspace.FileSystem { return s.inst.FS }

// Root is the workspace root as commands see it.
func (s *Session) Root() string { return s.inst.Root }

// Done is closed when the session ends; Err then says why.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err is nil while the session lives, and then why it ended (wrapping
// ErrClosed, ErrShuttingDown, or ErrPaused when it was paused: Resume
// makes it again, a new *Session).
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
	// ForkOf is the session this one was forked from (Manager.Fork).
	ForkOf string `json:"forkOf,omitempty"`
	// Background are the session's background commands (bash with
	// background), running or ended and kept.
	Background []tools.Background `json:"background,omitempty"`
	// Detached are the session's detached calls (Detach), running or
	// ended and kept.
	Detached []CallInfo `json:"detached,omitempty"`
	// Lost says what a session resumed by a later run of the daemon, or
	// taken over from another replica, did not get back of what it had —
	// its journal's history, its diff since its start, a skill — each
	// with why; empty when it lost none of them.
	Lost []string `json:"lost,omitempty"`
	// State is StateRunning or StatePaused (Manager.Pause); PausedAt is
	// when it was paused.
	State    string     `json:"state"`
	PausedAt *time.Time `json:"pausedAt,omitempty"`
}

// Info returns a snapshot of the session.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := Info{
		ID: s.id, Tenant: s.tenant, Backend: s.m.backend.Name(), Root: s.inst.Root, Workspace: s.inst.ID,
		Settings: s.settings, Created: s.created, LastUsed: s.lastUsed,
		IdleTimeout: Duration(s.idle), CallsInFlight: s.inflight, Pooled: s.pooled, ForkOf: s.forkOf,
		Lost: slices.Clone(s.lost), State: StateRunning,
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
	return s.run(ctx, op, "", start, fn)
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

// run is Do's work once admit took the call's slot, which run gives back;
// call names the call in the audit ("" for none).
func (s *Session) run(ctx context.Context, op, call string, start time.Time, fn func(ctx context.Context) (failed bool, err error)) error {
	ev := CallEvent{Tenant: s.tenant, Session: s.id, Tool: op, Call: call}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	// A call that may change the workspace waits for its first tree.
	failed := false
	fctx, done, err := s.settle(cctx, op)
	if err == nil {
		failed, err = fn(fctx)
		done()
	}
	if errors.Is(err, workspace.ErrUnavailable) {
		settle(ctx, s.inst)
	}
	var lost error
	if s.inst.Ended() {
		// The call failed because the workspace is gone: the session ends
		// now, and the call says so, not the tool's error — also when the
		// watch of the workspace is ending it and has not yet cancelled
		// the session's context.
		lost = s.m.lose(s)
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
	case lost != nil:
		ev.Outcome = OutcomeClosed
		err = fmt.Errorf("%w (during the call)", lost)
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
// failure of the tool is a Result with IsError); the error is Do's. The
// call is named opts.CallID (a new "call-…" when empty) in the audit log,
// its tool call's line and its commands' egress lines alike.
func (s *Session) Call(ctx context.Context, tool string, args json.RawMessage, opts tools.CallOptions) (tools.Result, error) {
	start := time.Now()
	if opts.CallID == "" {
		opts.CallID = randomID("call-")
	}
	if err := s.admit(tool); err != nil {
		return tools.Result{}, err
	}
	var res tools.Result
	err := s.run(ctx, tool, opts.CallID, start, s.toolCall(tool, args, opts, &res))
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
		s.dropResults()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
		leaving := s.leave.Load() && s.inst.Leave != nil
		pausing := s.pausing.Load() && s.inst.Pause != nil
		// A session left for another run keeps the background commands
		// its workspace holds (tools.Set.Release).
		stop := s.set.Close
		if leaving {
			stop = s.set.Release
		}
		if err := stop(rctx); err != nil {
			s.m.o.logger.Warn("the session's background commands did not end in time", "session", s.id, "err", err)
		}
		release := s.inst.Close
		switch {
		case leaving:
			release = s.inst.Leave
		case pausing:
			s.pausedBackground = s.set.Background()
			release = func(context.Context) error {
				// A pause is bounded by ctx too: one that fails leaks
				// nothing (Manager.Pause brings the workspace back).
				pctx, cancel := context.WithTimeout(ctx, removeTimeout)
				defer cancel()
				ws, err := s.inst.Pause(pctx)
				if err != nil && ws == nil {
					ws = runningOn(s.inst)
				}
				s.pausedWS, s.pauseErr = ws, err
				return nil
			}
		}
		// The first tree's read and the journal's store are done with
		// before the workspace is released: Close removes the session's
		// state directory, where they may be kept, and nothing writes
		// there after.
		berr := s.currentBase().close()
		jerr := s.dropJournal()
		s.closeErr = errors.Join(release(rctx), jerr, berr)
		s.eg.close()
		cancel()
		s.m.release(s.tenant)
		switch {
		case leaving:
			s.m.o.logger.Info("session left running, for another run of the daemon", "tenant", s.tenant, "session", s.id, "workspace", s.inst.ID)
		case pausing:
		default:
			s.m.o.logger.Info("session ended", "tenant", s.tenant, "session", s.id, "reason", cause.Error())
		}
	})
	return s.closeErr
}
