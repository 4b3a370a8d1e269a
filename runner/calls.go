package runner

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/tools"
)

// MaxDetached is how many detached calls a session keeps at once: running,
// or ended with their results kept. Starting one more forgets the oldest
// ended one's result; when all are running, Detach fails with ErrBusy.
const MaxDetached = 32

// maxGone is how many ended calls whose results are no longer kept a
// session remembers, so that asking for one says why its result is gone
// rather than that there is no such call.
const maxGone = 256

// The defaults of WithDetachedResults.
const (
	DefaultDetachedResultBytes = 16 << 20
	DefaultDetachedResultTTL   = 10 * time.Minute
)

// A Detached is a tool call started with Session.Detach. It runs to its end
// whether or not anyone waits for it, unless the session ends first. Its
// result is kept in the daemon's memory, bounded three ways: a session's
// results hold at most WithDetachedResults' bytes (a newer result displaces
// the oldest), each is kept for WithDetachedResults' time after its call
// ends, and each draws on DetachRequest.Hold while kept. A result that is
// not kept, or no longer, is answered by Result as an error wrapping
// ErrResultNotKept that says which limit it met.
type Detached struct {
	ID      string
	Tool    string
	Started time.Time

	done chan struct{}

	mu      sync.Mutex // guards the fields below
	ended   time.Time
	res     tools.Result
	err     error  // Do's (the session ended during the call), or why res is not kept
	size    int64  // the bytes res holds
	release func() // gives size back to the Hold; nil when res is not kept
}

// Done is closed when the call has ended.
func (d *Detached) Done() <-chan struct{} { return d.done }

// Result is the call's result and Do's error once it has ended (see
// Session.Call); ok is false while it runs. A kept result's Structured is
// its JSON (a json.RawMessage), as it is held. A result not kept is an
// error wrapping ErrResultNotKept.
func (d *Detached) Result() (res tools.Result, err error, ok bool) {
	select {
	case <-d.done:
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.res, d.err, true
	default:
		return tools.Result{}, nil, false
	}
}

// Ended is when the call ended, or the zero time while it runs.
func (d *Detached) Ended() time.Time {
	select {
	case <-d.done:
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.ended
	default:
		return time.Time{}
	}
}

// Size is the bytes of memory the call's kept result holds: 0 while it
// runs and once its result is not kept.
func (d *Detached) Size() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.size
}

// DetachRequest is a call for Session.Detach.
type DetachRequest struct {
	Tool string
	Args json.RawMessage
	// Options are the call's; Progress is ignored: no one may be there to
	// take it.
	Options tools.CallOptions
	// Hold, when set, is the memory budget the call's result draws on
	// while it is kept: its size when the call ends, given back when the
	// result is forgotten (displaced, expired, or the session's end). When
	// Hold refuses, the session's older results are forgotten, oldest
	// first, until it agrees; when none is left the result is not kept,
	// and says Hold's error. Hold must not block.
	Hold delivery.Hold
}

// Detach starts a tool call that outlives its caller: it takes a slot for
// calls in flight as Call does (failing at once with ErrBusy or ErrClosed),
// then runs with a context of its own, which only the session's end
// cancels. Find the call later with Session.Detached.
func (s *Session) Detach(req DetachRequest) (*Detached, error) {
	d := &Detached{ID: "call-" + strings.ToLower(rand.Text()[:16]), Tool: req.Tool, Started: time.Now(), done: make(chan struct{})}
	s.mu.Lock()
	var freed []func()
	if len(s.detached) >= MaxDetached {
		i := slices.IndexFunc(s.detached, ended)
		if i < 0 {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %d detached calls are running, the most a session keeps", ErrBusy, MaxDetached)
		}
		freed = append(freed, s.forgetResult(s.detached[i], fmt.Errorf("%w: it was forgotten to make room for a newer call (a session keeps %d detached calls)", ErrResultNotKept, MaxDetached)))
	}
	s.detached = append(s.detached, d)
	s.mu.Unlock()
	giveBack(freed)
	if err := s.admit(req.Tool); err != nil {
		s.mu.Lock()
		s.detached = slices.DeleteFunc(s.detached, func(x *Detached) bool { return x == d })
		s.mu.Unlock()
		return nil, err
	}
	// Recorded before it is accepted, so that a later run of the daemon
	// knows it was (ErrInterrupted); a record that cannot be written
	// fails nothing (the call would then be unknown after a restart).
	if err := s.m.publish(context.Background(), s, s.tenantEgress); err != nil {
		s.m.o.logger.Warn("the session's record does not name its detached call", "session", s.id, "call", d.ID, "error", err)
	}
	opts := req.Options
	opts.Progress = nil
	opts.CallID = d.ID
	args := slices.Clone(req.Args) // the caller's buffer may be reused once Detach returns
	go func() {
		var res tools.Result
		err := s.run(context.Background(), req.Tool, d.ID, d.Started, s.toolCall(req.Tool, args, opts, &res))
		s.keep(d, res, err, req.Hold)
		close(d.done)
	}()
	return d, nil
}

// ended reports whether d's call has ended.
func ended(d *Detached) bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// keep decides what d, whose call just ended, keeps: Do's error, its result
// within the session's bytes and hold, or why its result is not kept.
func (s *Session) keep(d *Detached, res tools.Result, err error, hold delivery.Hold) {
	d.mu.Lock()
	d.ended = time.Now()
	d.mu.Unlock()
	if err != nil {
		d.mu.Lock()
		d.err = err
		d.mu.Unlock()
		return
	}
	limit := s.m.o.resultBytes
	kept, n, err := keptForm(res)
	switch {
	case err != nil:
		err = fmt.Errorf("%w: it has no JSON form: %v", ErrResultNotKept, err)
	case n > limit:
		err = fmt.Errorf("%w: its %d bytes are over the %d bytes of results a session keeps (limits.detachedResultBytes)", ErrResultNotKept, n, limit)
	}
	if err != nil {
		s.mu.Lock()
		s.forgetResult(d, err)
		s.mu.Unlock()
		return
	}
	displaced := fmt.Errorf("%w: a newer call's result took its place (a session keeps %d bytes of results, limits.detachedResultBytes)", ErrResultNotKept, limit)
	s.mu.Lock()
	var freed []func()
	for s.keptBytes+n > limit {
		f, ok := s.forgetOldest(d, displaced)
		if !ok {
			// What is left is the results of calls ending as this one does.
			s.forgetResult(d, fmt.Errorf("%w: the session's other results hold its %d bytes of results (limits.detachedResultBytes)", ErrResultNotKept, limit))
			s.mu.Unlock()
			giveBack(freed)
			return
		}
		freed = append(freed, f)
	}
	s.keptBytes += n // taken before Hold is asked, so that calls ending together stay within limit
	s.mu.Unlock()
	giveBack(freed)
	release := func() {}
	if hold != nil {
		for {
			if release, err = hold(s.ctx, n); err == nil {
				break
			}
			s.mu.Lock()
			f, ok := s.forgetOldest(d, fmt.Errorf("%w: a newer call's result took its place (the memory budget had no room for both: %v)", ErrResultNotKept, err))
			s.mu.Unlock()
			if !ok {
				break
			}
			giveBack([]func(){f})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		s.keptBytes -= n
		s.forgetResult(d, fmt.Errorf("%w: %v", ErrResultNotKept, err))
	case s.resultsDropped:
		// The session ended while the call did: nothing keeps results now.
		s.keptBytes -= n
		release()
		d.mu.Lock()
		d.err = fmt.Errorf("%w (as the call ended)", context.Cause(s.ctx))
		d.mu.Unlock()
	default:
		d.mu.Lock()
		d.res, d.size, d.release = kept, n, release
		d.mu.Unlock()
	}
}

// keptForm is res as a kept result holds it, its structured content as
// JSON so that its size is what it holds, and that size.
func keptForm(res tools.Result) (tools.Result, int64, error) {
	n := int64(len(res.Text))
	if res.Structured != nil {
		raw, err := json.Marshal(res.Structured)
		if err != nil {
			return res, 0, err
		}
		res.Structured = json.RawMessage(raw)
		n += int64(len(raw))
	}
	if res.Image != nil {
		n += int64(len(res.Image.Data) + len(res.Image.MIMEType))
	}
	if res.Commit != nil {
		raw, _ := json.Marshal(res.Commit)
		n += int64(len(raw))
	}
	return res, n, nil
}

// forgetOldest forgets the oldest kept result but except's, with why, and
// returns what gives its memory back; ok is false when there is none. s.mu
// is held.
func (s *Session) forgetOldest(except *Detached, why error) (release func(), ok bool) {
	for _, d := range s.detached {
		if d != except && d.Size() > 0 {
			return s.forgetResult(d, why), true
		}
	}
	return nil, false
}

// forgetResult moves d to the calls whose results are gone and returns
// what gives its memory back (to call without s.mu). Its Result is then
// why, or the error it ended with, if any. s.mu is held.
func (s *Session) forgetResult(d *Detached, why error) func() {
	s.detached = slices.DeleteFunc(s.detached, func(x *Detached) bool { return x == d })
	s.gone = append(s.gone, d)
	if len(s.gone) > maxGone {
		s.gone = slices.Delete(s.gone, 0, len(s.gone)-maxGone)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	release := d.release
	s.keptBytes -= d.size
	if d.err == nil {
		d.err = why
	}
	d.res, d.size, d.release = tools.Result{}, 0, nil
	return release
}

// giveBack calls each of fns that is not nil.
func giveBack(fns []func()) {
	for _, f := range fns {
		if f != nil {
			f()
		}
	}
}

// expireResults forgets the results of calls that ended ttl or longer
// before now, and returns what gives their memory back.
func (s *Session) expireResults(now time.Time, ttl time.Duration) []func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var freed []func()
	for _, d := range slices.Clone(s.detached) {
		if t := d.Ended(); d.Size() > 0 && now.Sub(t) >= ttl {
			freed = append(freed, s.forgetResult(d, fmt.Errorf("%w: it expired, %v after its call ended (limits.detachedResultTTL)", ErrResultNotKept, ttl)))
		}
	}
	return freed
}

// dropResults gives back the memory of every kept result, as the session
// ends; a call that ends later keeps none.
func (s *Session) dropResults() {
	s.mu.Lock()
	s.resultsDropped = true
	var freed []func()
	for _, d := range s.detached {
		d.mu.Lock()
		freed = append(freed, d.release)
		s.keptBytes -= d.size
		d.res, d.size, d.release = tools.Result{}, 0, nil
		d.mu.Unlock()
	}
	s.mu.Unlock()
	giveBack(freed)
}

// Detached finds a detached call by its ID: one running, one whose result
// is kept, or one of the last ended ones whose result is gone (its Result
// says why).
func (s *Session) Detached(id string) (*Detached, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, list := range [][]*Detached{s.detached, s.gone} {
		for _, d := range list {
			if d.ID == id {
				return d, nil
			}
		}
	}
	if slices.Contains(s.interrupted, id) {
		return nil, fmt.Errorf("%w: call %s of session %s was accepted before %s", ErrInterrupted, id, s.id, cmp.Or(s.interruptedBy, "the daemon restarted"))
	}
	return nil, fmt.Errorf("%w: no detached call %s in session %s (a session remembers its last %d)", ErrNotFound, id, s.id, MaxDetached+maxGone)
}

// detachedIDs are the IDs of the detached calls the session knows, newest
// last — those an earlier run accepted, then those whose results are
// gone, then those running or kept — at most MaxDetached+maxGone; s.mu is
// held.
func (s *Session) detachedIDs() []string {
	ids := slices.Clone(s.interrupted)
	for _, list := range [][]*Detached{s.gone, s.detached} {
		for _, d := range list {
			ids = append(ids, d.ID)
		}
	}
	return ids[max(0, len(ids)-(MaxDetached+maxGone)):]
}

// CallInfo describes a detached call, as a session's description shows it.
type CallInfo struct {
	ID      string     `json:"id"`
	Tool    string     `json:"tool"`
	Started time.Time  `json:"started"`
	Ended   *time.Time `json:"ended,omitempty"`
}

func (d *Detached) info() CallInfo {
	in := CallInfo{ID: d.ID, Tool: d.Tool, Started: d.Started}
	if t := d.Ended(); !t.IsZero() {
		in.Ended = &t
	}
	return in
}
