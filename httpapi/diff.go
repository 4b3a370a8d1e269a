package httpapi

import (
	"context"
	"net/http"
	"strconv"

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
	// The diff reads files of up to a tenant's share of the memory budget
	// over the files read at once (and the transfer cap), each drawn from
	// the budget while it is held; larger ones are named, not shown.
	req.MaxFileBytes = min(s.o.maxTransfer, s.o.budget/2/runner.DiffReaders)
	l := leaseOf(r.Context())
	req.Hold = func(_ context.Context, n int64) (func(), error) {
		if err := l.take(n); err != nil {
			return nil, err
		}
		return func() { l.put(n) }, nil
	}
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
