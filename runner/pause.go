package runner

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// Pausing a session gives back its workspace's CPU and memory between
// turns, keeping its files (Instance.Pause: Docker stops the container).
// A paused session keeps its ID, tenant, settings, creation time and
// lifetime, which runs on: one paused past its lifetime is removed. Its
// idle time is not counted while it is paused, and starts again from its
// resume. What lived in the workspace's memory does not survive a pause:
// its processes and background commands end (bash_output of one answers
// that the pause ended it), and so does what the daemon held of it
// beside its files — its journal, its diff's baseline, its detached
// calls' results. Resuming it brings its workspace back (Docker starts
// the same container: a fresh agent, the same files) and makes the
// session again from what it was, as a later run of the daemon does after
// a restart (revive): its egress proxy, secrets and tools as before.

// WithAutoResume makes a request for a paused session (Get) resume it
// first, rather than fail with ErrPaused (default false).
func WithAutoResume(on bool) Option { return func(o *options) { o.autoResume = on } }

// pausedSession is a session Pause stopped.
type pausedSession struct {
	id, tenant string
	// rec is what revive makes the session again from.
	rec backend.Record
	// info describes it, as Describe shows it.
	info Info
	// mu is held while it pauses and while it resumes; ws is nil until
	// it has paused, and gone set once it is no longer paused (resumed,
	// deleted, expired).
	mu   sync.Mutex
	ws   *backend.Paused
	gone bool
	// background are its background commands as the pause ended them.
	background []tools.Background
}

// err is what a call to the paused session fails with.
func (p *pausedSession) err() error {
	return fmt.Errorf("%w: session %s (since %s): resume it first (POST /v1/sessions/%s/resume, or sandboxd session resume %s), or ask the operator to set sessions.autoResume, which resumes a paused session on its next request",
		ErrPaused, p.id, p.info.PausedAt.Format(time.RFC3339), p.id, p.id)
}

// Pause stops the tenant's session id (Instance.Pause) and keeps it,
// paused, until Resume, Delete or the end of its lifetime: its calls in
// flight are cancelled and its background commands stopped first, as at
// Delete; from then on every request for it fails with ErrPaused (or
// resumes it, WithAutoResume). It returns the session as it is paused. A
// session already paused is returned as it is. It fails with ErrNoPause
// on a backend that cannot pause, and as Get does for a session the
// tenant does not have. When the backend fails to stop the workspace (an
// engine's error, ctx's end), the session runs on, made again as Resume
// makes it, and the error says why (pauseFailed); it stays paused only
// when the workspace cannot be brought back either.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (_ Info, err error) {
	defer func() { m.snapOp("pause", err) }()
	m.mu.Lock()
	if p := m.paused[id]; p != nil && p.tenant == tenant {
		m.mu.Unlock()
		p.mu.Lock() // one that pauses now has paused once this returns
		defer p.mu.Unlock()
		if p.gone {
			return Info{}, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return p.describe(), nil
	}
	s := m.sessions[id]
	closing := m.closing
	m.mu.Unlock()
	switch {
	case s == nil || s.tenant != tenant:
		return Info{}, m.notHeld(tenant, id)
	case s.inst.Pause == nil:
		return Info{}, fmt.Errorf("%w (the %s backend's sessions run until they end; delete the session, or snapshot it first)", ErrNoPause, m.backend.Name())
	case closing:
		return Info{}, ErrShuttingDown
	}
	rec, err := s.record(s.tenantEgress)
	if err != nil {
		return Info{}, err
	}
	info := s.Info()
	now := time.Now()
	info.State, info.PausedAt, info.CallsInFlight, info.LastUsed, info.Detached, info.Background = StatePaused, &now, 0, now, nil, nil
	p := &pausedSession{id: id, tenant: tenant, rec: rec, info: info}
	p.mu.Lock()
	defer p.mu.Unlock()
	m.mu.Lock()
	if m.sessions[id] != s || m.paused[id] != nil || m.closing {
		m.mu.Unlock()
		return Info{}, fmt.Errorf("%w: session %s ended, or was paused, while it paused", ErrClosed, id)
	}
	delete(m.sessions, id)
	m.paused[id] = p
	m.perTenant[tenant]++ // the paused session's place; the live one's is given back as it closes
	m.deleting.Add(1)     // Shutdown waits for the pause
	m.mu.Unlock()
	defer m.deleting.Done()
	s.pausing.Store(true)
	cause := fmt.Errorf("%w: session %s was paused", ErrPaused, id)
	if err := s.close(ctx, cause, false); err != nil {
		// Its journal or first tree not let go: the workspace is paused
		// all the same.
		m.o.logger.Warn("pausing a session: what the daemon held of it was not all let go", "tenant", tenant, "session", id, "error", err)
	}
	p.ws = s.pausedWS
	p.background = s.pausedBackground
	p.info.Background = p.background
	if s.pauseErr != nil {
		return Info{}, m.pauseFailed(ctx, p, s.pauseErr)
	}
	m.o.logger.Info("session paused", "tenant", tenant, "session", id, "workspace", p.ws.ID)
	return p.describe(), nil
}

// pauseFailed brings back p, whose workspace failed to pause with cause
// (Instance.Pause: it runs on, or is kept half stopped), as a running
// session again, made as Resume makes one; it holds p.mu. What the pause
// ended stays ended — calls in flight, background commands, what the
// daemon held beside the files — while the files, settings and ID are
// the session's as before. When the workspace cannot be brought back
// either, the session stays paused for a later Resume. The error names
// the cause, of the kind workspace.ErrTimeout for a pause cut short by
// ctx, else of workspace.ErrUnavailable (or backend.ErrUnreachable's), and
// what became of the session.
func (m *Manager) pauseFailed(ctx context.Context, p *pausedSession, cause error) error {
	kind := workspace.ErrUnavailable
	if ctx.Err() != nil || errors.Is(cause, context.DeadlineExceeded) {
		kind = workspace.ErrTimeout
	}
	fail := func(format string, a ...any) error {
		return &workspace.Error{Kind: kind, Msg: fmt.Sprintf("runner: pausing session %s failed: %v; ", p.id, cause) + fmt.Sprintf(format, a...), Err: cause}
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adoptTimeout)
	defer cancel()
	inst, err := p.ws.Resume(bctx)
	if err != nil {
		m.o.logger.Warn("pausing a session failed, and it could not be brought back: it stays paused", "tenant", p.tenant, "session", p.id, "error", cause, "resume", err)
		return fail("bringing it back failed too (%v): it stays paused — resume it (POST /v1/sessions/%s/resume, or sandboxd session resume %s) once the backend answers, or delete it", err, p.id, p.id)
	}
	_, err = m.revive(bctx, inst, p.rec, revival{from: "the session before its pause failed", background: p.background, pausedAt: *p.info.PausedAt})
	m.forget(p)
	if err != nil {
		// revive closed the workspace: the session is gone.
		m.mu.Lock()
		m.ended[p.id] = lostSession{tenant: p.tenant, cause: fmt.Errorf("%w: its pause failed (%v), and making it again failed: %v", ErrClosed, cause, err), removed: closedChan}
		m.mu.Unlock()
		m.o.logger.Warn("pausing a session failed, and it could not be made again: it ended", "tenant", p.tenant, "session", p.id, "error", cause, "revive", err)
		return fail("making it again failed (%v), and it ended", err)
	}
	m.o.logger.Warn("pausing a session failed: it runs on", "tenant", p.tenant, "session", p.id, "error", cause)
	return fail("it runs on (its calls in flight and background commands were ended) — try the pause again, or check the backend")
}

// notHeld is why the tenant's session id is not one this run holds.
func (m *Manager) notHeld(tenant, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gone(tenant, id)
}

// closedChan is a closed channel.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// forget takes p out of the paused sessions, giving back its place; it
// holds p.mu.
func (m *Manager) forget(p *pausedSession) {
	p.gone = true
	m.mu.Lock()
	if m.paused[p.id] == p {
		delete(m.paused, p.id)
	}
	m.mu.Unlock()
	m.release(p.tenant)
}

// describe is p's Info; p.mu is held.
func (p *pausedSession) describe() Info {
	in := p.info
	in.Background = slices.Clone(p.background)
	return in
}

// Resume brings the tenant's paused session id back (backend.Paused): the
// same ID, settings, tenant, creation time and lifetime, and its files;
// its idle time starts again now. It returns the session, also one that
// was not paused. It fails as Get does for a session the tenant does not
// have; when the backend cannot start the workspace again, the session
// stays paused and the error says why.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (*Session, error) {
	m.mu.Lock()
	p := m.paused[id]
	if p == nil || p.tenant != tenant {
		s := m.sessions[id]
		m.mu.Unlock()
		if s != nil && s.tenant == tenant {
			return s, nil
		}
		return m.Get(tenant, id)
	}
	m.mu.Unlock()
	return m.resumePaused(ctx, p)
}

// resumePaused is Resume of p.
func (m *Manager) resumePaused(ctx context.Context, p *pausedSession) (_ *Session, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m.mu.Lock()
	if p.gone || m.paused[p.id] != p { // resumed or ended while this one waited
		s := m.sessions[p.id]
		err := m.gone(p.tenant, p.id)
		m.mu.Unlock()
		if s != nil && s.tenant == p.tenant {
			return s, nil
		}
		return nil, err
	}
	closing := m.closing
	m.mu.Unlock()
	if closing {
		return nil, ErrShuttingDown
	}
	defer func() { m.snapOp("resume", err) }()
	inst, err := p.ws.Resume(ctx)
	if err != nil {
		return nil, fmt.Errorf("runner: resuming session %s: %w (it stays paused: try again, or delete it)", p.id, err)
	}
	s, err := m.revive(ctx, inst, p.rec, revival{
		from:       "the session's pause",
		background: p.background, pausedAt: *p.info.PausedAt,
	})
	if err != nil {
		// revive closed the workspace: the session is gone.
		m.forget(p)
		return nil, fmt.Errorf("runner: resuming session %s: %w", p.id, err)
	}
	m.forget(p)
	m.o.logger.Info("session resumed from its pause", "tenant", p.tenant, "session", p.id, "workspace", inst.ID, "paused_for", time.Since(*p.info.PausedAt))
	return s, nil
}

// pausedFor is the tenant's paused session id, or nil.
func (m *Manager) pausedFor(tenant, id string) *pausedSession {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.paused[id]; p != nil && p.tenant == tenant {
		return p
	}
	return nil
}

// getPaused answers Get for p: ErrPaused, or p resumed WithAutoResume.
func (m *Manager) getPaused(p *pausedSession) (*Session, error) {
	if !m.o.autoResume {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.gone {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, p.id)
		}
		return nil, p.err()
	}
	ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
	defer cancel()
	return m.resumePaused(ctx, p)
}

// deletePaused removes p's workspace, as Delete.
func (m *Manager) deletePaused(ctx context.Context, p *pausedSession) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return fmt.Errorf("%w: %s", ErrNotFound, p.id)
	}
	m.forget(p)
	if p.ws == nil {
		return nil
	}
	err := p.ws.Close(context.WithoutCancel(ctx))
	m.o.logger.Info("session ended", "tenant", p.tenant, "session", p.id, "reason", "deleted while paused")
	return err
}

// expirePaused removes the paused sessions past their lifetime at now;
// one that pauses or resumes meanwhile is looked at by the next sweep.
func (m *Manager) expirePaused(now time.Time) {
	m.mu.Lock()
	var due []*pausedSession
	for _, p := range m.paused {
		if p.rec.Lifetime > 0 && now.Sub(p.rec.Created) >= p.rec.Lifetime {
			due = append(due, p)
		}
	}
	m.mu.Unlock()
	for _, p := range due {
		if !p.mu.TryLock() {
			continue
		}
		if !p.gone && p.ws != nil {
			ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
			err := p.ws.Close(ctx)
			cancel()
			m.forget(p) // once removed: not found means gone
			m.o.logger.Info("session ended", "tenant", p.tenant, "session", p.id, "reason", "its lifetime of "+p.rec.Lifetime.String()+" is over (paused)", "error", err)
		}
		p.mu.Unlock()
	}
}

// shutdownPaused leaves the paused sessions for the daemon's next run
// (backend.Paused.Leave), or removes them WithEndOnShutdown or where the
// backend cannot keep them; it returns how many it left.
func (m *Manager) shutdownPaused(ctx context.Context) (left int, err error) {
	m.mu.Lock()
	all := make([]*pausedSession, 0, len(m.paused))
	for _, p := range m.paused {
		all = append(all, p)
	}
	clear(m.paused)
	m.mu.Unlock()
	var errs []error
	for _, p := range all {
		p.mu.Lock()
		if !p.gone && p.ws != nil {
			p.gone = true
			if p.ws.Leave != nil && !m.o.endOnShutdown {
				errs = append(errs, p.ws.Leave(ctx))
				left++
			} else {
				errs = append(errs, p.ws.Close(ctx))
			}
		}
		p.mu.Unlock()
	}
	return left, errors.Join(errs...)
}

// keepPaused takes back a session an earlier run left paused (Resumer).
func (m *Manager) keepPaused(rs backend.Resumed) error {
	rec := rs.Record
	var r record
	if err := json.Unmarshal(rec.Data, &r); err != nil {
		return fmt.Errorf("the record of session %s is unreadable: %w", rec.Session, err)
	}
	at := rs.Seen
	info := Info{
		ID: rec.Session, Tenant: rec.Tenant, Backend: m.backend.Name(), Root: rs.Paused.Root, Workspace: rs.Paused.ID,
		Settings: r.Settings, Created: r.Created, LastUsed: at, IdleTimeout: r.Idle, Pooled: r.Pooled,
		State: StatePaused, PausedAt: &at,
	}
	if r.Lifetime > 0 {
		t := r.Created.Add(time.Duration(r.Lifetime))
		info.ExpiresAt = &t
	}
	p := &pausedSession{id: rec.Session, tenant: rec.Tenant, rec: rec, info: info, ws: rs.Paused}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.paused[p.id] = p
	m.perTenant[p.tenant]++
	return nil
}

// revival is how revive makes a session again beyond its record.
type revival struct {
	// from names the run that held the session before, for what Info.Lost
	// says ("the replica that held it before").
	from string
	// background are the background commands a pause ended, at pausedAt.
	background []tools.Background
	pausedAt   time.Time
}

// pausedCause is what bash_output says of a background command that the
// session's pause at t ended.
func pausedCause(t time.Time) string {
	return "the session was paused at " + t.UTC().Format(time.RFC3339) + ", which ended it (processes do not survive a pause)"
}

// States of a session, as Info.State says them.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// Describe returns the tenant's session id as Info, a paused one too
// (State StatePaused), which it never resumes. It fails as Get does for a
// session the tenant does not have.
func (m *Manager) Describe(tenant, id string) (Info, error) {
	if p := m.pausedFor(tenant, id); p != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.gone && p.ws != nil {
			return p.describe(), nil
		}
	}
	s, err := m.Get(tenant, id)
	if err != nil {
		return Info{}, err
	}
	return s.Info(), nil
}

// Sessions describes the tenant's sessions, the paused ones among them,
// oldest first.
func (m *Manager) Sessions(tenant string) []Info {
	var out []Info
	for _, s := range m.List(tenant) {
		out = append(out, s.Info())
	}
	m.mu.Lock()
	var paused []*pausedSession
	for _, p := range m.paused {
		if p.tenant == tenant {
			paused = append(paused, p)
		}
	}
	m.mu.Unlock()
	for _, p := range paused {
		p.mu.Lock()
		if !p.gone && p.ws != nil {
			out = append(out, p.describe())
		}
		p.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Info) int { return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID)) })
	return out
}

// runningOn is the workspace of inst, whose pause failed before it
// stopped anything, as the Paused that brings it back: inst itself.
func runningOn(inst *backend.Instance) *backend.Paused {
	return &backend.Paused{
		ID: inst.ID, Root: inst.Root, Close: inst.Close, Leave: inst.Leave,
		Resume: func(context.Context) (*backend.Instance, error) { return inst, nil },
	}
}
