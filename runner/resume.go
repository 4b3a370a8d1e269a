package runner

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/backend"
)

// WithEndOnShutdown makes Shutdown end every session, removing its
// workspace, also those a backend lets outlive the daemon's run
// (Instance.Leave: Docker with a state directory, Kubernetes replicas).
// By default (false) Shutdown leaves those: their calls in flight finish
// within Shutdown's context, their workspaces run on with their
// background commands, and the daemon's next run (or another replica)
// takes them back.
func WithEndOnShutdown(end bool) Option { return func(o *options) { o.endOnShutdown = end } }

// resumeTimeout bounds the resumption of the sessions an earlier run left.
const resumeTimeout = 5 * time.Minute

// resume takes back the sessions an earlier run of the daemon left on a
// backend.Resumer, with their IDs, settings, creation times and expiry,
// and their idle time counted from when that run was last seen alive. It
// removes those past their lifetime or idle timeout; the backend removed
// those whose workspace no longer runs, or whose uid another session
// holds. What cannot be taken back is logged, and fails nothing.
func (m *Manager) resume(ctx context.Context, r backend.Resumer) {
	ctx, cancel := context.WithTimeout(ctx, resumeTimeout)
	defer cancel()
	got, err := r.Resume(ctx, m.selector())
	if err != nil {
		m.o.logger.Warn("some sessions of an earlier run were not resumed", "backend", r.Name(), "error", err)
	}
	now := time.Now()
	for _, rs := range got {
		rec := rs.Record
		why := ""
		switch {
		case rec.Lifetime > 0 && now.Sub(rec.Created) >= rec.Lifetime:
			why = "its lifetime of " + rec.Lifetime.String() + " is over"
		case rec.Idle > 0 && now.Sub(rs.Seen) >= rec.Idle && rs.Paused == nil: // a paused one's idle time is not counted
			why = "idle for " + rec.Idle.String() + " since the daemon stopped"
		}
		if why != "" {
			closeWS := rs.Instance.Close
			if rs.Paused != nil {
				closeWS = rs.Paused.Close
			}
			err := closeWS(context.WithoutCancel(ctx))
			m.o.logger.Info("session of an earlier run ended", "tenant", rec.Tenant, "session", rec.Session, "reason", why, "error", err)
			continue
		}
		if rs.Paused != nil {
			if err := m.keepPaused(rs); err != nil {
				m.o.logger.Warn("paused session of an earlier run not kept", "tenant", rec.Tenant, "session", rec.Session, "error", err, "removed", rs.Paused.Close(context.WithoutCancel(ctx)))
				continue
			}
			m.o.logger.Info("paused session of an earlier run kept, paused", "tenant", rec.Tenant, "session", rec.Session, "workspace", rs.Paused.ID)
			continue
		}
		s, err := m.revive(ctx, rs.Instance, rec, revival{from: "the run of the daemon that made it"})
		if err != nil {
			m.o.logger.Warn("session of an earlier run not resumed", "tenant", rec.Tenant, "session", rec.Session, "error", err)
			continue
		}
		s.mu.Lock()
		s.lastUsed = rs.Seen
		s.mu.Unlock()
		m.o.logger.Info("session resumed", "tenant", rec.Tenant, "session", rec.Session, "workspace", rs.Instance.ID)
	}
}
