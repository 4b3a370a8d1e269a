package runner

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/tools"
)

// MaxDetached is how many detached calls a session keeps at once: running,
// or ended with their results not yet forgotten. Starting one more forgets
// the oldest ended one; when all are running, Detach fails with ErrBusy.
const MaxDetached = 32

// A Detached is a tool call started with Session.Detach. It runs to its end
// whether or not anyone waits for it, unless the session ends first, and its
// result stays with the session (at most MaxDetached calls are kept) until
// the session ends.
type Detached struct {
	ID      string
	Tool    string
	Started time.Time

	done  chan struct{}
	ended time.Time
	res   tools.Result
	err   error // Do's: the session ended during the call, …
}

// Done is closed when the call has ended.
func (d *Detached) Done() <-chan struct{} { return d.done }

// Result is the call's result and Do's error once it has ended (see
// Session.Call); ok is false while it runs.
func (d *Detached) Result() (res tools.Result, err error, ok bool) {
	select {
	case <-d.done:
		return d.res, d.err, true
	default:
		return tools.Result{}, nil, false
	}
}

// Ended is when the call ended, or the zero time while it runs.
func (d *Detached) Ended() time.Time {
	select {
	case <-d.done:
		return d.ended
	default:
		return time.Time{}
	}
}

// Detach starts a tool call that outlives its caller: it takes a slot for
// calls in flight as Call does (failing at once with ErrBusy or ErrClosed),
// then runs with a context of its own, which only the session's end
// cancels. Progress in opts is ignored: no one may be there to take it.
// Find the call later with Session.Detached.
func (s *Session) Detach(tool string, args json.RawMessage, opts tools.CallOptions) (*Detached, error) {
	d := &Detached{ID: "call-" + strings.ToLower(rand.Text()[:16]), Tool: tool, Started: time.Now(), done: make(chan struct{})}
	s.mu.Lock()
	if len(s.detached) >= MaxDetached {
		i := slices.IndexFunc(s.detached, func(d *Detached) bool { _, _, ok := d.Result(); return ok })
		if i < 0 {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %d detached calls are running, the most a session keeps", ErrBusy, MaxDetached)
		}
		s.detached = slices.Delete(s.detached, i, i+1)
	}
	s.detached = append(s.detached, d)
	s.mu.Unlock()
	if err := s.admit(tool); err != nil {
		s.forget(d)
		return nil, err
	}
	opts.Progress = nil
	args = slices.Clone(args) // the caller's buffer may be reused once Detach returns
	go func() {
		d.err = s.run(context.Background(), tool, d.Started, s.toolCall(tool, args, opts, &d.res))
		d.ended = time.Now()
		close(d.done)
	}()
	return d, nil
}

// Detached finds a detached call by its ID.
func (s *Session) Detached(id string) (*Detached, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.detached {
		if d.ID == id {
			return d, nil
		}
	}
	return nil, fmt.Errorf("%w: no detached call %s in session %s (a session keeps the last %d)", ErrNotFound, id, s.id, MaxDetached)
}

func (s *Session) forget(d *Detached) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.detached, d); i >= 0 {
		s.detached = slices.Delete(s.detached, i, i+1)
	}
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
