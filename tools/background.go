package tools

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
)

// Background commands: bash with background: true starts a command and
// answers at once with its id; bash_output reads what it wrote since the
// last read (waiting, when asked, for it to end) and bash_kill stops it.
//
// The surface is bash's own argument plus two tools, as Claude Code's
// run_in_background, BashOutput and KillShell: starting a command is
// still bash (same command, timeout, stdin, environment), and reading
// and stopping are separate tools because they differ in what they may
// do — bash_output changes nothing, bash_kill kills — which a host's
// permission prompts and a model's choice of tool can then tell apart. A
// single tool with an action argument would hide that.
//
// A background command runs through the same workspace.Bash as any other,
// under a context of the Set's: stopping it (bash_kill, its timeout,
// Set.Close at the session's end) ends that context, and the adapter then
// kills its whole process tree, as for a foreground command, before Run
// returns. Bounds: Config.BashBackground commands kept at once (an ended
// one is forgotten to make room for a new one; running ones are never),
// Config.BashBackgroundBytes of output kept for each (the newest; what is
// dropped is counted and said), and the command's timeout, by default
// bashMaxTimeoutMs.

// BackgroundResult is the structured content of bash with background,
// bash_output and bash_kill: a background command's state and the output
// it wrote since the last bash_output or bash_kill.
type BackgroundResult struct {
	ID      string `json:"id"`
	Command string `json:"command"`
	// Running is set while the command runs; once it ended, ExitCode,
	// Signal, TimedOut and Killed say how.
	Running  bool   `json:"running"`
	ExitCode int    `json:"exitCode"` // -1 when killed by a signal
	Signal   string `json:"signal"`
	TimedOut bool   `json:"timedOut"`
	// Killed says bash_kill or the session's end stopped it.
	Killed bool `json:"killed"`
	// Output is the output written since the last read (stdout and stderr
	// in the order written), cut to its last maxLines lines or maxBytes
	// bytes; OutputPath is where all of it was saved when it was cut.
	Output     string `json:"output"`
	Truncated  bool   `json:"truncated"`
	OutputPath string `json:"outputPath"`
	// DroppedBytes is how much output since the last read was not kept
	// (over bashBackgroundBytes) and is lost.
	DroppedBytes int64 `json:"droppedBytes"`
	// OutputBytes is all the output the command wrote so far.
	OutputBytes int64 `json:"outputBytes"`
	DurationMs  int64 `json:"durationMs"`
}

// Background describes one background command of a Set, as a session's
// description shows it.
type Background struct {
	ID          string    `json:"id"`
	Command     string    `json:"command"`
	Started     time.Time `json:"started"`
	Running     bool      `json:"running"`
	ExitCode    int       `json:"exitCode"`
	Signal      string    `json:"signal,omitempty"`
	TimedOut    bool      `json:"timedOut,omitempty"`
	Killed      bool      `json:"killed,omitempty"`
	OutputBytes int64     `json:"outputBytes"`
	// Unread is how much of the kept output bash_output has not given yet.
	Unread int64 `json:"unread"`
}

// backgrounds are a Set's background commands.
type backgrounds struct {
	ctx    context.Context // ends at Close: every command's context derives from it
	stop   context.CancelFunc
	mu     sync.Mutex
	jobs   []*job // in the order started
	lastID int
	closed bool
}

// job is one background command.
type job struct {
	id, command string
	started     time.Time
	timeout     time.Duration
	cancel      context.CancelFunc
	done        chan struct{} // closed once Run returned: the tree is gone

	mu      sync.Mutex
	kept    []byte // the newest output: at least keep bytes when there were
	keep    int
	total   int64 // bytes written in all; kept ends there
	next    int64 // where the next read starts
	killed  bool
	res     workspace.Result
	runErr  error
	endedAt time.Time
}

func (j *job) write(_ workspace.Stream, p []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.total += int64(len(p))
	j.kept = append(j.kept, p...)
	if len(j.kept) > 2*j.keep { // trimmed now and then, not at every write
		j.kept = append(j.kept[:0], j.kept[len(j.kept)-j.keep:]...)
	}
}

// unread returns the output not read yet and how much of it was dropped,
// and marks it read.
func (j *job) unread() (p []byte, dropped int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	kept := j.kept[max(0, len(j.kept)-j.keep):]
	start := j.total - int64(len(kept))
	if j.next < start {
		dropped = start - j.next
		j.next = start
	}
	p = slices.Clone(kept[j.next-start:])
	j.next = j.total
	return p, dropped
}

func (j *job) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

func (j *job) describe() Background {
	j.mu.Lock()
	defer j.mu.Unlock()
	b := Background{ID: j.id, Command: j.command, Started: j.started, Running: !j.ended(), OutputBytes: j.total,
		Unread: j.total - max(j.next, j.total-int64(min(len(j.kept), j.keep)))}
	if !b.Running {
		b.ExitCode, b.Signal, b.TimedOut, b.Killed = j.res.ExitCode, j.res.Signal, j.res.TimedOut, j.killed
	}
	return b
}

// startBackground starts cmd as a background command and answers with its
// id, refusing when Config.BashBackground commands are running.
func (s *Set) startBackground(command string, cmd workspace.Command) (Result, error) {
	bg := &s.bg
	bg.mu.Lock()
	defer bg.mu.Unlock()
	switch {
	case bg.closed:
		return Result{}, newError(workspace.ErrUnavailable, "the session is ending: no background command can start")
	case s.cfg.BashBackground == 0:
		return Result{}, newError(workspace.ErrForbidden, "background commands are off in this session (bashBackground is 0): run the command in the foreground, with a timeout")
	}
	if len(bg.jobs) >= s.cfg.BashBackground {
		i := slices.IndexFunc(bg.jobs, (*job).ended)
		if i < 0 {
			return Result{}, newError(workspace.ErrForbidden, "%d background commands are running, the most this session keeps (bashBackground): stop one with bash_kill, or wait for one to end with bash_output", len(bg.jobs))
		}
		bg.jobs = slices.Delete(bg.jobs, i, i+1) // the oldest that ended makes room
	}
	bg.lastID++
	ctx, cancel := context.WithCancel(bg.ctx)
	j := &job{
		id: "bg" + strconv.Itoa(bg.lastID), command: command, started: time.Now(), timeout: cmd.Timeout,
		cancel: cancel, done: make(chan struct{}), keep: int(min(s.cfg.BashBackgroundBytes, 1<<40)),
	}
	cmd.Output = j.write
	bg.jobs = append(bg.jobs, j)
	go func() {
		res, err := s.env.Bash.Run(ctx, cmd)
		cancel()
		j.mu.Lock()
		j.res, j.runErr, j.endedAt = res, err, time.Now()
		if errors.Is(err, context.Canceled) { // stopped: bash_kill or Close
			j.killed, j.runErr = true, nil
		}
		j.mu.Unlock()
		close(j.done)
	}()
	r := &BackgroundResult{ID: j.id, Command: command, Running: true}
	return Result{Text: fmt.Sprintf("Started background command %s. Read its output with bash_output (id %q; wait up to a number of seconds for it to end), stop it with bash_kill. It is killed after %g s, or when the session ends.",
		j.id, j.id, cmd.Timeout.Seconds()), Structured: r}, nil
}

// job finds a background command by id.
func (s *Set) job(id string) (*job, error) {
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	for _, j := range s.bg.jobs {
		if j.id == id {
			return j, nil
		}
	}
	ids := make([]string, 0, len(s.bg.jobs))
	for _, j := range s.bg.jobs {
		ids = append(ids, j.id)
	}
	if len(ids) == 0 {
		return nil, newError(workspace.ErrNotFound, "no background command %q: there are none (an ended one is forgotten when a new one needs its place)", id)
	}
	return nil, newError(workspace.ErrNotFound, "no background command %q; there are %v", id, ids)
}

type bashOutputArgs struct {
	ID   string   `json:"id" jsonschema:"the background command's id, as bash with background gave it (bg1, …)"`
	Wait *float64 `json:"wait,omitempty" jsonschema:"seconds to wait for the command to end before answering (at most {{seconds .BashMaxTimeoutMs}}; default: answer at once)"`
}

var bashOutputTool = newTool(spec[bashOutputArgs, *BackgroundResult]{
	name: "bash_output", skill: "workspace.shell", companion: "bash",
	describe: func(s *Set) string {
		return fmt.Sprintf("Read the output a background command (started by bash with background: true) wrote since the last read, stdout and stderr in the order written, and whether it is still running or how it ended. With wait, first wait up to that many seconds for it to end. The newest %s of its output is kept; shown are the last %d lines or %s, the rest saved to a file as bash does.",
			kb(s.cfg.BashBackgroundBytes), s.cfg.MaxLines, kb(int64(s.cfg.MaxBytes)))
	},
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 0, "wait") },
	handle:    (*Set).bashOutput,
	offered:   backgroundOffered,
	readOnly:  yes,
})

func (s *Set) bashOutput(ctx context.Context, p bashOutputArgs, _ *call) (Result, error) {
	j, err := s.job(p.ID)
	if err != nil {
		return Result{}, err
	}
	if p.Wait != nil {
		maxS := float64(s.cfg.BashMaxTimeoutMs) / 1000
		if w := *p.Wait; w < 0 || w > maxS {
			return Result{}, invalid("wait must be from 0 to %v seconds, got %v", maxS, w)
		}
		t := time.NewTimer(time.Duration(*p.Wait * float64(time.Second)))
		defer t.Stop()
		select {
		case <-j.done:
		case <-t.C:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	return s.backgroundResult(ctx, j)
}

type bashKillArgs struct {
	ID string `json:"id" jsonschema:"the background command's id, as bash with background gave it (bg1, …)"`
}

var bashKillTool = newTool(spec[bashKillArgs, *BackgroundResult]{
	name: "bash_kill", skill: "workspace.shell", companion: "bash",
	describe: func(*Set) string {
		return "Stop a background command: it and everything it started are killed. Answers with its last output and how it ended."
	},
	handle:  (*Set).bashKill,
	offered: backgroundOffered,
})

// backgroundOffered: bash's companions come with it when the configuration
// allows background commands (bashBackground above 0).
func backgroundOffered(s *Set) bool { return s.cfg.BashBackground > 0 && bashTool.offered(s) }

func (s *Set) bashKill(ctx context.Context, p bashKillArgs, _ *call) (Result, error) {
	j, err := s.job(p.ID)
	if err != nil {
		return Result{}, err
	}
	if !j.ended() {
		j.cancel()
		select {
		case <-j.done:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	return s.backgroundResult(ctx, j)
}

// backgroundResult reads j's new output and says how it stands.
func (s *Set) backgroundResult(ctx context.Context, j *job) (Result, error) {
	ended := j.ended() // before the read: output written before the end is all in
	p, dropped := j.unread()
	out := newCapture(ctx, s.cfg.MaxFileBytes, s.cfg.MaxBytes)
	out.write(workspace.Stdout, p)
	r := &BackgroundResult{ID: j.id, Command: j.command, Running: !ended, DroppedBytes: dropped}
	var notes []string
	if dropped > 0 {
		notes = append(notes, fmt.Sprintf("[%s of output before this was not kept (over bashBackgroundBytes, %s) and is lost.]", kb(dropped), kb(int64(j.keep))))
	}
	var more []string
	r.Output, r.Truncated, r.OutputPath, _, more = s.keepOutput(ctx, out)
	notes = append(notes, more...)
	j.mu.Lock()
	r.OutputBytes = j.total
	if ended {
		r.ExitCode, r.Signal, r.TimedOut, r.Killed = j.res.ExitCode, j.res.Signal, j.res.TimedOut, j.killed
		r.DurationMs = j.endedAt.Sub(j.started).Milliseconds()
	} else {
		r.DurationMs = time.Since(j.started).Milliseconds()
	}
	res, runErr := j.res, j.runErr
	j.mu.Unlock()
	switch {
	case !ended:
		notes = append(notes, fmt.Sprintf("[%s is still running (%s so far, %s of output in all).]", j.id, time.Duration(r.DurationMs)*time.Millisecond, kb(r.OutputBytes)))
	case runErr != nil:
		return Result{}, runErr
	case r.Killed:
		notes = append(notes, fmt.Sprintf("[%s was stopped: the command and everything it started were killed.]", j.id))
	default:
		notes = append(notes, ending(res, j.timeout))
	}
	return Result{Text: outputText(r.Output, notes), Structured: r}, nil
}

// Background lists the session's background commands, running or ended
// and kept, in the order they started.
func (s *Set) Background() []Background {
	s.bg.mu.Lock()
	jobs := slices.Clone(s.bg.jobs)
	s.bg.mu.Unlock()
	out := make([]Background, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, j.describe())
	}
	return out
}

// Close stops what the Set keeps running beyond a call: every background
// command is stopped, its whole process tree killed by its adapter, and
// Close waits for them to end until ctx does (then it returns ctx's
// error, and the commands still end in the background). After Close, bash
// with background fails (Unavailable); other calls are unaffected.
// Close may be called more than once.
func (s *Set) Close(ctx context.Context) error {
	s.bg.mu.Lock()
	s.bg.closed = true
	jobs := slices.Clone(s.bg.jobs)
	s.bg.mu.Unlock()
	s.bg.stop()
	for _, j := range jobs {
		select {
		case <-j.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// BackgroundTools are bash's companions, offered with bash when the
// configuration allows background commands (bashBackground above 0).
var BackgroundTools []string
