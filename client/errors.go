package client

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/workspace"
)

// The daemon's own error kinds, as an *Error matches them with errors.Is.
// Those the session host defines are its sentinels (package runner's), so
// one errors.Is test serves a program that embeds a runner.Manager and one
// that calls a daemon; the others are the HTTP layer's.
var (
	// ErrUnauthorized: no token, or one of no tenant (401).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrSessionEnded: the session has ended, or ended during the call
	// (410): runner.ErrClosed.
	ErrSessionEnded = runner.ErrClosed
	// ErrTooManySessions: the tenant is at its cap of sessions (429).
	ErrTooManySessions = runner.ErrTooManySessions
	// ErrBusy: the session is at its cap of calls in flight (429).
	ErrBusy = runner.ErrBusy
	// ErrOverloaded: the daemon's memory budget is held by requests in
	// flight and kept results; retry after Error.RetryAfter (503).
	ErrOverloaded = errors.New("the daemon is overloaded")
	// ErrShuttingDown: the daemon is draining (503).
	ErrShuttingDown = runner.ErrShuttingDown
	// ErrResultNotKept: a detached call's result is not kept, or no longer
	// (410).
	ErrResultNotKept = runner.ErrResultNotKept
	// ErrInterrupted: a detached call was accepted before the daemon
	// restarted, and its result is lost (410): runner.ErrInterrupted.
	ErrInterrupted = runner.ErrInterrupted
	// ErrTooLarge: a body or transfer over its cap (413).
	ErrTooLarge = errors.New("too large")
	// ErrInternal: the daemon failed (500).
	ErrInternal = errors.New("the daemon failed")
	// ErrSnapshotCorrupt: the snapshot's files are not what its manifest
	// says; it is never restored (422): snapshot.ErrCorrupt.
	ErrSnapshotCorrupt = snapshot.ErrCorrupt
	// ErrSnapshotLimit: the tenant's snapshots are at their cap (507):
	// snapshot.ErrLimit.
	ErrSnapshotLimit = snapshot.ErrLimit
	// ErrNoSpace: a disk is full (507): the daemon's snapshot store
	// (snapshot.ErrNoSpace), or a session's workspace an upload went
	// into (workspace.ErrNoSpace).
	ErrNoSpace = snapshot.ErrNoSpace
	// ErrSnapshotsOff: the daemon keeps no snapshots (501):
	// runner.ErrNoSnapshots.
	ErrSnapshotsOff = runner.ErrNoSnapshots
	// ErrPaused: the session is paused; SessionResume brings it back
	// (409): runner.ErrPaused.
	ErrPaused = runner.ErrPaused
	// ErrPauseOff: the daemon's backend cannot pause sessions (501):
	// runner.ErrNoPause.
	ErrPauseOff = runner.ErrNoPause
)

// The workspace kinds callers test most, for convenience: an *Error of
// kind "NotFound" (no such session, no such file) matches ErrNotFound, and
// so fs.ErrNotExist; "Forbidden" matches ErrForbidden, "InvalidArgument"
// ErrInvalidArgument. Every other workspace kind matches its
// workspace.Kind.
var (
	ErrNotFound        = workspace.ErrNotFound
	ErrForbidden       = workspace.ErrForbidden
	ErrInvalidArgument = workspace.ErrInvalidArgument
)

// kinds maps the daemon's kinds to their sentinels.
var kinds = map[string]error{
	"Unauthorized":    ErrUnauthorized,
	"SessionEnded":    ErrSessionEnded,
	"TooManySessions": ErrTooManySessions,
	"Busy":            ErrBusy,
	"Paused":          ErrPaused,
	"PauseOff":        ErrPauseOff,
	"Overloaded":      ErrOverloaded,
	"ShuttingDown":    ErrShuttingDown,
	"ResultNotKept":   ErrResultNotKept,
	"Interrupted":     ErrInterrupted,
	"TooLarge":        ErrTooLarge,
	"Internal":        ErrInternal,
	"SnapshotCorrupt": ErrSnapshotCorrupt,
	"SnapshotInvalid": ErrInvalidArgument,
	"SnapshotLimit":   ErrSnapshotLimit,
	"NoSpace":         ErrNoSpace,
	"SnapshotsOff":    ErrSnapshotsOff,
}

// byStatus is the sentinel of an answer that names no kind (a proxy's).
var byStatus = map[int]error{
	http.StatusUnauthorized:          ErrUnauthorized,
	http.StatusNotFound:              ErrNotFound,
	http.StatusGone:                  ErrSessionEnded,
	http.StatusRequestEntityTooLarge: ErrTooLarge,
}

// Error is an error answer of the daemon: {"error": Kind, "message":
// Message} with its HTTP status.
type Error struct {
	StatusCode int
	Kind       string // "NotFound", "SessionEnded", … ("" when the answer named none)
	Message    string
	// RetryAfter is how long the daemon asked to wait before a retry
	// (429, 503), or 0.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%d %s)", e.Message, e.StatusCode, cmp.Or(e.Kind, http.StatusText(e.StatusCode)))
}

// Unwrap returns the sentinel of the error's kind: one of this package's,
// a *workspace.Kind, or nil for a kind it does not know.
func (e *Error) Unwrap() error {
	if err, ok := kinds[e.Kind]; ok {
		return err
	}
	if k := workspace.KindByName(e.Kind); k != nil {
		return k
	}
	if e.Kind == "" {
		return byStatus[e.StatusCode]
	}
	return nil
}

// errorOf reads an error answer.
func errorOf(res *http.Response) *Error {
	e := &Error{StatusCode: res.StatusCode}
	data, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	var body struct{ Error, Message string }
	if json.Unmarshal(data, &body) == nil && body.Message != "" {
		e.Kind, e.Message = body.Error, body.Message
	} else {
		e.Message = cmp.Or(strings.TrimSpace(string(data)), http.StatusText(res.StatusCode))
	}
	if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}
