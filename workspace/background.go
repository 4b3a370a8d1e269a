package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// BackgroundBash is a Bash that keeps background commands itself, where
// they run: a command started with StartBackground runs on, and its output
// goes on into a bounded ring beside it, whether or not anyone is connected
// to read it. An adapter across a process boundary (the agent in a
// container) implements it so that its background commands outlive the
// host's connection, and with it a daemon that restarts; what they wrote
// meanwhile, and how they ended, are there for the next reader. The ring
// lives with the command, so its output costs the host nothing until it is
// read.
//
// Use Background to get one for any Bash: it returns the Bash itself when
// it is a BackgroundBash, and otherwise keeps the commands in the calling
// process (Jobs), where they end with it.
type BackgroundBash interface {
	Bash
	// StartBackground starts req.Command and returns its state, ID
	// included. It fails with ErrForbidden when req.Max commands run
	// already (one that ended is forgotten to make room; running ones
	// never are), and as Run does for a command that cannot start.
	StartBackground(ctx context.Context, req BackgroundRequest) (BackgroundStatus, error)
	// ReadBackground returns what command id wrote since the last read
	// (ReadBackground or KillBackground) and how it stands, having waited
	// first up to wait for it to end. It fails with ErrNotFound for an ID
	// it does not keep.
	ReadBackground(ctx context.Context, id string, wait time.Duration) (BackgroundRead, error)
	// KillBackground stops command id — its whole process tree is killed,
	// as at a Run's cancellation — and returns, once it has ended, what it
	// wrote since the last read and how it ended.
	KillBackground(ctx context.Context, id string) (BackgroundRead, error)
	// ListBackground lists the commands kept, running or ended, in the
	// order they started.
	ListBackground(ctx context.Context) ([]BackgroundStatus, error)
}

// BackgroundRequest is a command for StartBackground.
type BackgroundRequest struct {
	// Command is what runs, as Run takes it; Stdin and Output must be nil
	// (the command's input is Stdin here, its output the ring).
	Command Command
	// Name is how the command is shown (BackgroundStatus.Command); ""
	// shows its script, or its program and arguments.
	Name string
	// Stdin is the command's whole standard input.
	Stdin []byte
	// Keep is how many bytes of the newest output are kept for reading;
	// what is older is dropped, counted and said (BackgroundRead.Dropped).
	// It must be positive.
	Keep int64
	// Max is how many commands are kept at once (0: no bound).
	Max int
}

// BackgroundStatus is a background command's state.
type BackgroundStatus struct {
	ID string `json:"id"`
	// Command is how the command is shown: BackgroundRequest.Name, its
	// script, or its program and arguments.
	Command string        `json:"command"`
	Timeout time.Duration `json:"timeout,omitempty"`
	Started time.Time     `json:"started"`
	Running bool          `json:"running"`
	// Ended is when it ended; Result says how, and Killed that
	// KillBackground (or the end of whoever kept it) stopped it. Err is
	// the error Run failed with, "" when none.
	Ended  time.Time `json:"ended,omitzero"`
	Result Result    `json:"result,omitzero"`
	Killed bool      `json:"killed,omitempty"`
	Err    string    `json:"err,omitempty"`
	// ErrKind names Err's Kind, "" when it has none.
	ErrKind string `json:"errKind,omitempty"`
	// OutputBytes is all the output it wrote so far; Unread how much of
	// what is kept no read has returned yet.
	OutputBytes int64 `json:"outputBytes"`
	Unread      int64 `json:"unread"`
}

// RunErr is the error Run failed with, restored with its Kind; nil when
// none.
func (st BackgroundStatus) RunErr() error {
	if st.Err == "" {
		return nil
	}
	if k := KindByName(st.ErrKind); k != nil {
		return &Error{Kind: k, Msg: st.Err}
	}
	return errors.New(st.Err)
}

// BackgroundRead is what a read of a background command gives.
type BackgroundRead struct {
	BackgroundStatus
	// Output is what it wrote since the last read, stdout and stderr as
	// its Command asked (Combined: in the order written).
	Output []byte `json:"output,omitempty"`
	// Dropped is how much output since the last read was not kept (over
	// Keep) and is lost.
	Dropped int64 `json:"dropped,omitempty"`
}

// Background returns b's background commands: b itself when it keeps them
// (a BackgroundBash), and otherwise a Jobs over b, which keeps them in this
// process. durable reports which: only a BackgroundBash's commands outlive
// this process.
func Background(b Bash) (bg BackgroundBash, durable bool) {
	if bb, ok := b.(BackgroundBash); ok {
		return bb, true
	}
	return NewJobs(b), false
}

// Jobs keeps background commands over any Bash, in the process that holds
// it: each runs in a goroutine of its own through Bash.Run, its output kept
// in a ring of its Keep bytes. It is the fallback of Background, and the
// agent keeps its own commands with one, beside them in the container.
// Close stops them all. A Jobs is safe for concurrent use.
type Jobs struct {
	Bash
	ctx  context.Context // ends at Close: every command's context derives from it
	stop context.CancelFunc

	mu     sync.Mutex
	jobs   []*job // in the order started
	lastID int
	closed bool
}

var _ BackgroundBash = (*Jobs)(nil)

// NewJobs returns an empty Jobs running commands through b.
func NewJobs(b Bash) *Jobs {
	ctx, stop := context.WithCancel(context.Background())
	return &Jobs{Bash: b, ctx: ctx, stop: stop}
}

// job is one background command of a Jobs.
type job struct {
	st     BackgroundStatus // guarded by mu; Running, Ended, Result, Killed, Err set once it ends
	cancel context.CancelCauseFunc
	done   chan struct{} // closed once Run returned: the tree is gone

	mu   sync.Mutex
	kept []byte // the newest output: at least keep bytes when there were
	keep int
	next int64 // where the next read starts (st.OutputBytes is where kept ends)
}

// errKilled is the cause of a command KillBackground (or Close) stopped.
var errKilled = errors.New("killed")

func (j *job) write(_ Stream, p []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.st.OutputBytes += int64(len(p))
	j.kept = append(j.kept, p...)
	if len(j.kept) > 2*j.keep { // trimmed now and then, not at every write
		j.kept = append(j.kept[:0], j.kept[len(j.kept)-j.keep:]...)
	}
}

func (j *job) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// status is the job's state; j.mu is held.
func (j *job) status() BackgroundStatus {
	st := j.st
	kept := int64(min(len(j.kept), j.keep))
	st.Unread = st.OutputBytes - max(j.next, st.OutputBytes-kept)
	return st
}

// read returns what was not read yet, marking it read.
func (j *job) read() BackgroundRead {
	ended := j.ended() // before the read: output written before the end is all in
	j.mu.Lock()
	defer j.mu.Unlock()
	kept := j.kept[max(0, len(j.kept)-j.keep):]
	start := j.st.OutputBytes - int64(len(kept))
	var r BackgroundRead
	if j.next < start {
		r.Dropped = start - j.next
		j.next = start
	}
	r.Output = bytes.Clone(kept[j.next-start:])
	j.next = j.st.OutputBytes
	r.BackgroundStatus = j.status()
	if !ended {
		r.Running, r.Ended, r.Result, r.Killed, r.Err, r.ErrKind = true, time.Time{}, Result{}, false, "", ""
	}
	return r
}

// StartBackground starts req.Command through the Bash; see BackgroundBash.
func (js *Jobs) StartBackground(ctx context.Context, req BackgroundRequest) (BackgroundStatus, error) {
	cmd := req.Command
	switch {
	case cmd.Output != nil || cmd.Stdin != nil:
		return BackgroundStatus{}, Errorf(ErrInvalidArgument, "a background command's Output and Stdin are its ring and BackgroundRequest.Stdin")
	case req.Keep <= 0:
		return BackgroundStatus{}, Errorf(ErrInvalidArgument, "a background command keeps %d bytes of output: it must keep some", req.Keep)
	case (cmd.Script == "") == (len(cmd.Argv) == 0):
		return BackgroundStatus{}, Errorf(ErrInvalidArgument, "a background command needs a script or an argv, not both")
	}
	if err := ctx.Err(); err != nil {
		return BackgroundStatus{}, err
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.closed {
		return BackgroundStatus{}, Errorf(ErrUnavailable, "the background commands were stopped: no more can start")
	}
	if req.Max > 0 && len(js.jobs) >= req.Max {
		i := slices.IndexFunc(js.jobs, (*job).ended)
		if i < 0 {
			return BackgroundStatus{}, Errorf(ErrForbidden, "%d background commands are running, the most kept at once", len(js.jobs))
		}
		js.jobs = slices.Delete(js.jobs, i, i+1) // the oldest that ended makes room
	}
	js.lastID++
	label := req.Name
	switch {
	case label != "":
	case cmd.Script != "":
		label = cmd.Script
	default:
		label = strings.Join(cmd.Argv, " ")
	}
	jctx, cancel := context.WithCancelCause(js.ctx)
	j := &job{
		st:     BackgroundStatus{ID: "bg" + strconv.Itoa(js.lastID), Command: label, Timeout: cmd.Timeout, Started: time.Now(), Running: true},
		cancel: cancel, done: make(chan struct{}), keep: int(min(req.Keep, 1<<40)),
	}
	cmd.Output = j.write
	if len(req.Stdin) > 0 {
		cmd.Stdin = bytes.NewReader(req.Stdin)
	}
	js.jobs = append(js.jobs, j)
	go func() {
		res, err := js.Bash.Run(jctx, cmd)
		killed := errors.Is(context.Cause(jctx), errKilled) || js.ctx.Err() != nil
		cancel(nil)
		j.mu.Lock()
		j.st.Running, j.st.Ended, j.st.Result, j.st.Killed = false, time.Now(), res, killed
		if err != nil && !(killed && errors.Is(err, context.Canceled)) {
			j.st.Err = err.Error()
			if k := KindOf(err); k != nil {
				j.st.ErrKind = k.Name()
			}
		}
		j.mu.Unlock()
		close(j.done)
	}()
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.status(), nil
}

// find returns the job id.
func (js *Jobs) find(id string) (*job, error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	for _, j := range js.jobs {
		if j.st.ID == id {
			return j, nil
		}
	}
	if len(js.jobs) == 0 {
		return nil, Errorf(ErrNotFound, "no background command %q: there are none (an ended one is forgotten when a new one needs its place)", id)
	}
	ids := make([]string, len(js.jobs))
	for i, j := range js.jobs {
		ids[i] = j.st.ID
	}
	return nil, Errorf(ErrNotFound, "no background command %q; there are %s", id, strings.Join(ids, ", "))
}

// ReadBackground reads command id; see BackgroundBash.
func (js *Jobs) ReadBackground(ctx context.Context, id string, wait time.Duration) (BackgroundRead, error) {
	j, err := js.find(id)
	if err != nil {
		return BackgroundRead{}, err
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-j.done:
		case <-t.C:
		case <-ctx.Done():
			return BackgroundRead{}, ctx.Err()
		}
	}
	return j.read(), nil
}

// KillBackground stops command id; see BackgroundBash.
func (js *Jobs) KillBackground(ctx context.Context, id string) (BackgroundRead, error) {
	j, err := js.find(id)
	if err != nil {
		return BackgroundRead{}, err
	}
	j.cancel(errKilled)
	select {
	case <-j.done:
	case <-ctx.Done():
		return BackgroundRead{}, ctx.Err()
	}
	return j.read(), nil
}

// ListBackground lists the commands kept; see BackgroundBash.
func (js *Jobs) ListBackground(context.Context) ([]BackgroundStatus, error) {
	js.mu.Lock()
	jobs := slices.Clone(js.jobs)
	js.mu.Unlock()
	out := make([]BackgroundStatus, len(jobs))
	for i, j := range jobs {
		j.mu.Lock()
		out[i] = j.status()
		j.mu.Unlock()
	}
	return out, nil
}

// Close stops every command — each one's whole process tree is killed by
// the Bash — and waits for them to end until ctx does (then it returns
// ctx's error, and they still end in the background). After Close no
// command starts. Close may be called more than once.
func (js *Jobs) Close(ctx context.Context) error {
	js.mu.Lock()
	js.closed = true
	jobs := slices.Clone(js.jobs)
	js.mu.Unlock()
	js.stop()
	for _, j := range jobs {
		select {
		case <-j.done:
		case <-ctx.Done():
			return fmt.Errorf("background commands still ending: %w", ctx.Err())
		}
	}
	return nil
}
