package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/workspace"
)

// diff answers what the session changed (runner.Session.Diff) as a
// git-format patch: since the session began, or with ?since=COMMIT since a
// journal commit. An empty body is no change. Failures before the first
// byte are ordinary error answers; one after it cuts the stream, as a
// download does.
func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	var req runner.DiffRequest
	if v := r.URL.Query().Get("since"); v != "" || r.URL.Query().Has("since") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), "since: want a journal commit's number (0 for the journal's start), not "+strconv.Quote(v))
			return
		}
		req.Since = &n
	}
	req.MaxFileBytes, req.Hold = s.treeLimits(r)
	started := false
	err := sess.Do(r.Context(), "diff", func(ctx context.Context) (bool, error) {
		d, err := sess.Diff(ctx, req)
		if err != nil {
			return false, err
		}
		defer d.Close()
		w.Header().Set("Content-Type", "text/x-diff; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		started = true
		return false, d.WritePatch(ctx, w)
	})
	if err != nil {
		if started {
			s.o.logger.Warn("diff cut short", "tenant", tenantOf(r).Name, "session", sess.ID(), "error", err)
			panic(http.ErrAbortHandler)
		}
		s.fail(w, r, err)
	}
}

// treeLimits are the limits of a read of a session's whole tree (a diff, a
// new baseline): files of up to a tenant's share of the memory budget over
// the files read at once (and the transfer cap), each drawn from the
// budget while it is held; larger ones are named, not read.
func (s *Server) treeLimits(r *http.Request) (maxFileBytes int64, hold delivery.Hold) {
	l := leaseOf(r.Context())
	return min(s.o.maxTransfer, s.o.budget/2/runner.DiffReaders), func(_ context.Context, n int64) (func(), error) {
		if err := l.take(n); err != nil {
			return nil, err
		}
		return func() { l.put(n) }, nil
	}
}

// baseline takes a new baseline of the session (runner.Session.Rebaseline):
// the diff compares with the workspace as it is now from then on. It waits
// for the session's calls in flight that may change the workspace, and
// holds those that come meanwhile. The body, if any, is an empty object.
func (s *Server) baseline(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok || !s.decode(w, r, &struct{}{}) {
		return
	}
	info, err := s.rebaseline(r, sess, nil)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// rebaseline takes sess's new baseline as a call of its own (op
// "baseline"), running change first when set (see BaselineRequest.Change).
// before runs first within the call, outside the baseline's hold (an
// upload's read of its body).
func (s *Server) rebaseline(r *http.Request, sess *runner.Session, before func(ctx context.Context) (change func(context.Context) error, err error)) (runner.BaselineInfo, error) {
	req := runner.BaselineRequest{}
	req.MaxFileBytes, req.Hold = s.treeLimits(r)
	var info runner.BaselineInfo
	err := sess.Do(r.Context(), "baseline", func(ctx context.Context) (bool, error) {
		if before != nil {
			var err error
			if req.Change, err = before(ctx); err != nil {
				return false, err
			}
		}
		var err error
		info, err = sess.Rebaseline(ctx, req)
		return false, err
	})
	return info, err
}
