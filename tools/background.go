package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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
// A background command is kept where the workspace.Bash keeps it
// (workspace.Background): in the workspace itself when the Bash is a
// workspace.BackgroundBash — the agent in a container, where it runs on,
// its output kept in a ring inside the container's quotas, while no daemon
// is connected, so a restart of the daemon finds it, what it wrote
// meanwhile and how it ended — and otherwise in a workspace.Jobs of the
// Set's, in this process. Stopping it (bash_kill, its timeout, Set.Close
// at the session's end) kills its whole process tree, as for a foreground
// command. Bounds: Config.BashBackground commands kept at once (an ended
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
	// Egress is what the session's egress decided for the command's
	// connections since the last read (absent where commands have no
	// egress proxy).
	Egress []EgressDecision `json:"egress,omitempty"`
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

// backgrounds are a Set's background commands: the Bash's own when it
// keeps them (a workspace.BackgroundBash: the agent in a container, where
// they and their output outlive the daemon), else a workspace.Jobs of the
// Set's, in this process.
type backgrounds struct {
	workspace.BackgroundBash
	durable bool
	mu      sync.Mutex
	kept    map[string]keptJob // what this process holds of each command, while it is kept
	closed  bool
	// final is how the commands stood once Close had stopped them (the
	// workspace that kept them may be gone since).
	final []workspace.BackgroundStatus
	// cause is why the past commands ended (PastBackground), when there
	// are any.
	cause string
}

// keptJob is what this process holds of a background command: its egress
// decisions, and what to clean up once it ended (its long script's file).
type keptJob struct {
	trace   EgressTrace
	cleanup func()
}

func (bg *backgrounds) trace(id string) EgressTrace {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	return bg.kept[id].trace
}

// ended cleans up after command id, which has ended.
func (bg *backgrounds) ended(id string) {
	bg.mu.Lock()
	k, ok := bg.kept[id]
	cleanup := k.cleanup
	if ok {
		k.cleanup = nil
		bg.kept[id] = k
	}
	bg.mu.Unlock()
	if cleanup != nil {
		cleanup()
	}
}

// prune forgets what is held of commands no longer kept.
func (bg *backgrounds) prune(kept []workspace.BackgroundStatus) {
	bg.mu.Lock()
	var gone []keptJob
	for id, k := range bg.kept {
		if !slices.ContainsFunc(kept, func(st workspace.BackgroundStatus) bool { return st.ID == id }) {
			gone = append(gone, k)
			delete(bg.kept, id)
		}
	}
	bg.mu.Unlock()
	for _, k := range gone {
		if k.trace != nil {
			k.trace.Close()
		}
		if k.cleanup != nil {
			k.cleanup()
		}
	}
}

// backgroundCall bounds the calls a Set makes to its background commands
// on its own account (listing them for a description, stopping them).
const backgroundCall = 30 * time.Second

// startBackground starts cmd as a background command and answers with its
// id, refusing when Config.BashBackground commands are running.
//
// cleanup is called once the command has ended (as a read or the Set's end
// finds it), or did not start.
func (s *Set) startBackground(ctx context.Context, command string, cmd workspace.Command, tr EgressTrace, cleanup func()) (Result, error) {
	bg := s.bg
	started := false
	defer func() {
		if !started {
			cleanup()
			if tr != nil {
				tr.Close()
			}
		}
	}()
	bg.mu.Lock()
	closed := bg.closed
	bg.mu.Unlock()
	switch {
	case bg.BackgroundBash == nil:
		return Result{}, newError(workspace.ErrUnavailable, "this session runs no commands")
	case closed:
		return Result{}, newError(workspace.ErrUnavailable, "the session is ending: no background command can start")
	case s.cfg.BashBackground == 0:
		return Result{}, newError(workspace.ErrForbidden, "background commands are off in this session (bashBackground is 0): run the command in the foreground, with a timeout")
	}
	req := workspace.BackgroundRequest{Command: cmd, Name: command, Keep: min(s.cfg.BashBackgroundBytes, 1<<40), Max: s.cfg.BashBackground}
	if cmd.Stdin != nil {
		req.Stdin, _ = io.ReadAll(cmd.Stdin)
		req.Command.Stdin = nil
	}
	st, err := bg.StartBackground(ctx, req)
	switch {
	case errors.Is(err, workspace.ErrForbidden):
		return Result{}, newError(workspace.ErrForbidden, "%d background commands are running, the most this session keeps (bashBackground): stop one with bash_kill, or wait for one to end with bash_output", s.cfg.BashBackground)
	case err != nil:
		return Result{}, err
	}
	started = true
	bg.mu.Lock()
	if bg.kept == nil {
		bg.kept = map[string]keptJob{}
	}
	bg.kept[st.ID] = keptJob{trace: tr, cleanup: cleanup}
	bg.mu.Unlock()
	if list, err := bg.ListBackground(ctx); err == nil {
		bg.prune(list)
	}
	r := &BackgroundResult{ID: st.ID, Command: st.Command, Running: true}
	until := "or when the session ends"
	if bg.durable {
		until = "or when the session ends (it runs on while no client is connected: a restart of the daemon does not stop it)"
	}
	return Result{Text: fmt.Sprintf("Started background command %s. Read its output with bash_output (id %q; wait up to a number of seconds for it to end), stop it with bash_kill. It is killed after %g s, %s.",
		st.ID, st.ID, cmd.Timeout.Seconds(), until), Structured: r}, nil
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
	if p.ID == "" {
		return Result{}, invalid("id is required: the background command's id, as bash with background gave it (bg1, …)")
	}
	var wait time.Duration
	if p.Wait != nil {
		maxS := float64(s.cfg.BashMaxTimeoutMs) / 1000
		if w := *p.Wait; w > maxS { // not negative, as the schema says (checkBounds)
			return Result{}, invalid("wait must be from 0 to %v seconds, got %v", maxS, w)
		}
		wait = time.Duration(*p.Wait * float64(time.Second))
	}
	if s.bg.BackgroundBash == nil {
		return Result{}, newError(workspace.ErrNotFound, "no background command %q: this session runs no commands", p.ID)
	}
	r, err := s.bg.ReadBackground(ctx, p.ID, wait)
	if err != nil {
		return Result{}, err
	}
	return s.backgroundResult(ctx, r)
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
	if p.ID == "" {
		return Result{}, invalid("id is required: the background command's id, as bash with background gave it (bg1, …)")
	}
	if s.bg.BackgroundBash == nil {
		return Result{}, newError(workspace.ErrNotFound, "no background command %q: this session runs no commands", p.ID)
	}
	r, err := s.bg.KillBackground(ctx, p.ID)
	if err != nil {
		return Result{}, err
	}
	return s.backgroundResult(ctx, r)
}

// backgroundResult is what a read of a background command says.
func (s *Set) backgroundResult(ctx context.Context, rd workspace.BackgroundRead) (Result, error) {
	ended := !rd.Running
	out := newCapture(ctx, s.cfg.MaxFileBytes, s.cfg.MaxBytes)
	out.write(workspace.Stdout, rd.Output)
	r := &BackgroundResult{ID: rd.ID, Command: rd.Command, Running: rd.Running, DroppedBytes: rd.Dropped, OutputBytes: rd.OutputBytes}
	var notes []string
	if rd.Dropped > 0 {
		notes = append(notes, fmt.Sprintf("[%s of output before this was not kept (over bashBackgroundBytes, %s) and is lost.]", kb(rd.Dropped), kb(s.cfg.BashBackgroundBytes)))
	}
	var more []string
	r.Output, r.Truncated, r.OutputPath, _, more = s.keepOutput(ctx, out)
	notes = append(notes, more...)
	if ended {
		r.ExitCode, r.Signal, r.TimedOut, r.Killed = rd.Result.ExitCode, rd.Result.Signal, rd.Result.TimedOut, rd.Killed
		r.DurationMs = rd.Ended.Sub(rd.Started).Milliseconds()
	} else {
		r.DurationMs = time.Since(rd.Started).Milliseconds()
	}
	tr := s.bg.trace(rd.ID)
	if tr != nil {
		r.Egress = tr.Take(ctx, ended)
	}
	if ended {
		s.bg.ended(rd.ID)
	}
	switch {
	case !ended:
		notes = append(notes, fmt.Sprintf("[%s is still running (%s so far, %s of output in all).]", rd.ID, time.Duration(r.DurationMs)*time.Millisecond, kb(r.OutputBytes)))
	case s.bg.pastCause(rd.ID) != "":
		notes = append(notes, fmt.Sprintf("[%s ended: %s; what it wrote after the last read is lost.]", rd.ID, s.bg.pastCause(rd.ID)))
	case rd.RunErr() != nil:
		return Result{}, rd.RunErr()
	case r.Killed:
		notes = append(notes, fmt.Sprintf("[%s was stopped: the command and everything it started were killed.]", rd.ID))
	default:
		notes = append(notes, ending(rd.Result, rd.Timeout))
	}
	if tr != nil {
		notes = append(notes, egressNotes(tr, r.Egress, r.Output)...)
	}
	return Result{Text: outputText(r.Output, notes), Structured: r}, nil
}

// Background lists the session's background commands, running or ended
// and kept, in the order they started; nil when they cannot be listed now
// (the workspace does not answer). After Close it lists them as Close
// left them.
func (s *Set) Background() []Background {
	if s.bg.BackgroundBash == nil {
		return nil
	}
	s.bg.mu.Lock()
	list, closed := s.bg.final, s.bg.closed
	s.bg.mu.Unlock()
	if !closed {
		ctx, cancel := context.WithTimeout(context.Background(), backgroundCall)
		defer cancel()
		var err error
		if list, err = s.bg.ListBackground(ctx); err != nil {
			return nil
		}
	}
	out := make([]Background, 0, len(list))
	for _, st := range list {
		out = append(out, Background{ID: st.ID, Command: st.Command, Started: st.Started, Running: st.Running, ExitCode: st.Result.ExitCode,
			Signal: st.Result.Signal, TimedOut: st.Result.TimedOut, Killed: st.Killed, OutputBytes: st.OutputBytes, Unread: st.Unread})
	}
	return out
}

// DurableBackground reports whether the Set's background commands outlive
// this process: the workspace keeps them (workspace.Background).
func (s *Set) DurableBackground() bool { return s.bg.durable }

// Close stops what the Set keeps running beyond a call: every background
// command is stopped, its whole process tree killed by its adapter — the
// workspace's own ones too — and Close waits for them to end until ctx
// does (then it returns ctx's error, and the commands still end in the
// background). After Close, bash with background fails (Unavailable);
// other calls are unaffected. Close may be called more than once.
func (s *Set) Close(ctx context.Context) error {
	bg := s.bg
	bg.mu.Lock()
	bg.closed = true
	bg.mu.Unlock()
	defer bg.prune(nil)
	if bg.BackgroundBash == nil {
		return nil
	}
	var errs []error
	if j, ok := bg.BackgroundBash.(*workspace.Jobs); ok {
		errs = append(errs, j.Close(ctx))
	} else {
		list, err := bg.ListBackground(ctx)
		if err != nil {
			return err
		}
		for _, st := range list {
			if st.Running {
				if _, err := bg.KillBackground(ctx, st.ID); err != nil && !errors.Is(err, workspace.ErrNotFound) {
					errs = append(errs, err)
				}
			}
		}
	}
	final, err := bg.ListBackground(ctx)
	bg.mu.Lock()
	bg.final = final
	bg.mu.Unlock()
	return errors.Join(append(errs, err)...)
}

// Release lets go of what the Set holds in this process, and leaves
// running what outlives it: the workspace's own background commands
// (DurableBackground) run on for whoever holds the session next (a
// restarted daemon, another replica), while those this process keeps are
// stopped, as Close stops them. After Release, bash with background fails
// (Unavailable).
func (s *Set) Release(ctx context.Context) error {
	if !s.bg.durable {
		return s.Close(ctx)
	}
	s.bg.mu.Lock()
	s.bg.closed = true
	s.bg.mu.Unlock()
	s.bg.prune(nil)
	return nil
}

// BackgroundTools are bash's companions, offered with bash when the
// configuration allows background commands (bashBackground above 0).
var BackgroundTools []string
