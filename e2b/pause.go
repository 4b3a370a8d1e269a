package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sandboxd/sandboxd/runner"
)

// Pausing a sandbox is Manager.Pause of its session (on Docker its
// container stops; its files stay), resuming it Manager.Resume, which
// makes the session again with the same ID: a new run of the sandbox
// (newRun) over the same record, so its access tokens, metadata, env vars
// and ports are as before. What lived in its memory does not survive —
// its processes and watchers end at the pause, as every session's do.
//
// E2B keeps a paused sandbox until it is killed or resumed (for up to 30
// days): its timeout does not run while it is paused. The runner's
// lifetime does run on while a session is paused, so a pause sets it to
// pausedKeep from the pause, within the operator's maximum lifetime
// (sessions.maxLifetime, from the sandbox's creation), and a resume sets
// it to the timeout asked from the resume.

// pausedKeep is how long a paused sandbox is kept, as E2B keeps one.
const pausedKeep = 30 * 24 * time.Hour

// pauseTimeout bounds a pause that no request waits for (autoPause), and
// one whose request went away meanwhile.
const pauseTimeout = 5 * time.Minute

// defaultResumeTimeout is a resumed sandbox's timeout when POST
// /sandboxes/{id}/resume names none, as E2B's ResumedSandbox.
const defaultResumeTimeout = 15 * time.Second

// noPause is why this server's backend pauses no sandbox.
func (s *Server) noPause() error {
	return fmt.Errorf("%w: %w (the %s backend keeps no workspace of a stopped session; kill the sandbox instead)", errNotSupported, runner.ErrNoPause, s.m.Backend().Name())
}

// pause answers POST /sandboxes/{id}/pause: 204 once the sandbox is
// paused, 409 for one paused already, 404 for one the tenant does not
// have, 501 where the backend cannot pause.
func (s *Server) pause(w http.ResponseWriter, r *http.Request, t Tenant) {
	id := r.PathValue("id")
	b, paused, err := s.tenantLookup(t.Name, id)
	switch {
	case err != nil:
		s.fail(w, r, err)
	case paused != nil:
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused (since %s): connect to it to resume it", id, paused.PausedAt.UTC().Format(time.RFC3339)))
	default:
		if err := s.pauseRun(r.Context(), b); err != nil {
			s.fail(w, r, fmt.Errorf("pausing sandbox %s: %w", id, err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// pauseRun pauses b's session, to be kept paused for pausedKeep. The pause
// is not cut short by ctx's end (a workspace half stopped helps no one);
// when it fails, the session keeps the end it had, if it still runs.
func (s *Server) pauseRun(ctx context.Context, b *sandbox) error {
	if !b.sess.CanPause() {
		return s.noPause()
	}
	old := b.sess.ExpiresAt()
	keep := time.Now().Add(pausedKeep)
	if late := b.sess.LatestExpiry(); !late.IsZero() && keep.After(late) {
		keep = late
	}
	if err := b.sess.SetExpiry(keep); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	if _, err := s.m.Pause(ctx, b.tenant, b.id); err != nil {
		if b.sess.Err() == nil && !old.IsZero() {
			b.sess.SetExpiry(old)
		}
		return err
	}
	return nil
}

// resumedSandbox is E2B's ResumedSandbox.
type resumedSandbox struct {
	Timeout   *int  `json:"timeout"`
	AutoPause *bool `json:"autoPause"`
}

// resume answers POST /sandboxes/{id}/resume (deprecated in E2B's API for
// connect): 201 and the sandbox once it runs again, its timeout from now
// (default 15 s); 409 for a sandbox that runs.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, t Tenant) {
	var body resumedSandbox
	if !decode(w, r, &body) {
		return
	}
	timeout, ok := seconds(w, body.Timeout, defaultResumeTimeout)
	if !ok {
		return
	}
	id := r.PathValue("id")
	b, paused, err := s.tenantLookup(t.Name, id)
	switch {
	case err != nil:
		s.fail(w, r, err)
	case paused == nil:
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already running", id))
	default:
		s.resumeAnswer(w, r, b, timeout, body.AutoPause)
	}
}

// resumeAnswer resumes b's sandbox, its timeout then d from now, and
// answers it, 201. autoPause, when not nil, must be the sandbox's own:
// whether its timeout pauses it was said at its creation.
func (s *Server) resumeAnswer(w http.ResponseWriter, r *http.Request, b *sandbox, d time.Duration, autoPause *bool) {
	if autoPause != nil && *autoPause != b.autoPause {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("autoPause %v at resume: %v: a sandbox's autoPause is the one it was created with (%v)", *autoPause, errNotSupported, b.autoPause))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), pauseTimeout)
	defer cancel()
	sess, err := s.m.Resume(ctx, b.tenant, b.id)
	if err == nil {
		b, err = s.rerun(b, sess)
	}
	if err == nil {
		err = s.setEnd(b, time.Now().Add(d), false)
	}
	if err != nil {
		s.fail(w, r, fmt.Errorf("resuming sandbox %s: %w", b.id, err))
		return
	}
	writeJSON(w, http.StatusCreated, s.describe(b, false, nil))
}

// setEnd ends b's sandbox at end, or, onlyLater, not before it. The end of
// an autoPause sandbox pauses it (its timer); the session's own lifetime
// is then pausedKeep past it, within the operator's maximum. Any other
// sandbox's end is its session's.
func (s *Server) setEnd(b *sandbox, end time.Time, onlyLater bool) error {
	if !b.autoPause {
		if !onlyLater || end.After(b.sess.ExpiresAt()) {
			return b.sess.SetExpiry(end)
		}
		return nil
	}
	late := b.sess.LatestExpiry()
	if !late.IsZero() && end.After(late) {
		return &runner.SettingError{Setting: "timeout", Reason: fmt.Sprintf("it ends the sandbox after the operator's maximum lifetime, %s from its creation (sessions.maxLifetime)", late.Sub(b.started).Round(time.Second))}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if onlyLater && !end.After(b.end) {
		return nil
	}
	keep := end.Add(pausedKeep)
	if !late.IsZero() && keep.After(late) {
		keep = late
	}
	if err := b.sess.SetExpiry(keep); err != nil {
		return err
	}
	b.end = end
	if b.timer != nil {
		b.timer.Stop()
	}
	rec := b.record
	b.timer = time.AfterFunc(time.Until(end), func() { s.timeUp(rec) })
	return nil
}

// timeUp pauses rec's sandbox, whose timeout is over (autoPause), unless
// it was paused, ended or given a later end meanwhile.
func (s *Server) timeUp(rec *record) {
	rec.mu.Lock()
	due := !time.Now().Before(rec.end)
	rec.mu.Unlock()
	if !due {
		return
	}
	b, paused, err := s.lookup(rec.id)
	if err != nil || paused != nil || b.record != rec {
		return
	}
	if err := s.pauseRun(context.Background(), b); err != nil && !errors.Is(err, runner.ErrNotFound) && !errors.Is(err, runner.ErrClosed) {
		s.o.logger.Error("e2b: pausing a sandbox at its timeout (autoPause) failed", "tenant", rec.tenant, "sandbox", rec.id, "error", err)
		return
	}
	s.o.logger.Info("e2b: sandbox paused at its timeout (autoPause)", "tenant", rec.tenant, "sandbox", rec.id)
}

// timeout is when an autoPause sandbox's timeout pauses it.
func (rec *record) timeout() time.Time {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.end
}

// stopTimer stops an autoPause sandbox's timer, the sandbox forgotten.
func (rec *record) stopTimer() {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.timer != nil {
		rec.timer.Stop()
	}
}
