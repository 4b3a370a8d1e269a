package tools

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
)

// BashResult is the structured content of bash. A command that exits
// non-zero, is killed or times out is a BashResult, not a failure.
type BashResult struct {
	ExitCode int    `json:"exitCode"` // -1 when killed by a signal
	Signal   string `json:"signal"`   // "" when none
	TimedOut bool   `json:"timedOut"`
	// Output is the kept tail of stdout and stderr, interleaved as they
	// arrived: the last maxLines lines or maxBytes bytes.
	Output    string `json:"output"`
	Truncated bool   `json:"truncated"`
	// OutputPath is where the whole output was saved (relative to the
	// workspace root), or "" when Output is all of it.
	OutputPath string `json:"outputPath"`
	// OutputBytes is the size of the whole output; SavedBytes how much of it
	// OutputPath holds (less when it was over maxFileBytes).
	OutputBytes int64 `json:"outputBytes"`
	SavedBytes  int64 `json:"savedBytes,omitempty"`
	DurationMs  int64 `json:"durationMs"`
	// Egress is what the session's egress decided for the connections the
	// command made (absent where commands have no egress proxy).
	Egress []EgressDecision `json:"egress,omitempty"`
}

type bashArgs struct {
	Command string   `json:"command" jsonschema:"the command line, run by {{.Shell}}"`
	Timeout *float64 `json:"timeout,omitempty" jsonschema:"seconds before the command and everything it started are killed (default {{seconds .BashTimeoutMs}}, at most {{seconds .BashMaxTimeoutMs}})"`
	Stdin   *string  `json:"stdin,omitempty" jsonschema:"the command's standard input"`
	// Background starts the command and answers at once with its id (see
	// background.go); its default timeout is then bashMaxTimeoutMs. The
	// argument is offered when bashBackground is above 0.
	Background bool `json:"background,omitempty" jsonschema:"start the command and answer at once with its id, without waiting for it; its timeout is then {{seconds .BashMaxTimeoutMs}} s unless timeout says less"`
}

// bashOutput is the structured content of bash: a *BashResult, or a
// *BackgroundResult for a command started in the background.
type bashOutput interface{ bashOutput() }

func (*BashResult) bashOutput()       {}
func (*BackgroundResult) bashOutput() {}

var bashTool = newTool(spec[bashArgs, bashOutput]{
	name: "bash", skill: "workspace.shell",
	describe: func(s *Set) string {
		c := s.cfg
		desc := fmt.Sprintf("Run a shell command in the workspace root. Returns the end of its output (stdout and stderr, last %s) and how it ended; when there was more, the whole output (up to %s) is saved to a file under %s whose path the result gives. Non-zero exit, a signal or a timeout are reported, not failures. Default timeout %ds, at most %ds.",
			s.limits(), kb(c.MaxFileBytes), c.SpillDir, c.BashTimeoutMs/1000, c.BashMaxTimeoutMs/1000)
		desc += s.statelessNote()
		if sh := s.notBash(); sh != "" {
			desc += " " + noBashNote(sh)
		}
		if c.BashBackground > 0 {
			desc += fmt.Sprintf(" With background: true the command starts and the call answers at once with its id: read its output with bash_output, stop it with bash_kill (at most %d kept at once; killed when the session ends).", c.BashBackground)
		}
		return desc
	},
	constrain: func(props map[string]*jsonschema.Schema) { props["timeout"].ExclusiveMinimum = jsonschema.Ptr(0.0) },
	variants:  []any{BashResult{}, BackgroundResult{}},
	omit: func(s *Set) []string {
		if s.cfg.BashBackground > 0 {
			return nil
		}
		return []string{"background"}
	},
	handle: (*Set).bash,
	// The rules bind the file tools, not a command: a session with rules
	// is offered no bash.
	offered: func(s *Set) bool { return s.env.Bash != nil && !s.scoped() },
})

func (s *Set) bash(ctx context.Context, p bashArgs, c *call) (Result, error) {
	if strings.TrimSpace(p.Command) == "" {
		return Result{}, invalid("command is required")
	}
	timeout := time.Duration(s.cfg.BashTimeoutMs) * time.Millisecond
	if p.Background {
		timeout = time.Duration(s.cfg.BashMaxTimeoutMs) * time.Millisecond
	}
	if p.Timeout != nil {
		maxS := float64(s.cfg.BashMaxTimeoutMs) / 1000
		switch t := *p.Timeout; { // positive, as the schema says (checkBounds)
		case t > maxS:
			return Result{}, invalid("timeout %vs is over the %vs a command may ask for (bashMaxTimeoutMs, a setting of the tools configuration): ask for %v at most, or start the command with background: true and read it with bash_output", t, maxS, maxS)
		default:
			timeout = time.Duration(t * float64(time.Second))
		}
	}
	// One stream: the output keeps the order the command wrote it in (two
	// pipes read apart do not), at the cost of progress events telling
	// stderr from stdout.
	script, cleanup, err := s.script(ctx, p.Command, !p.Background)
	if err != nil {
		return Result{}, err
	}
	tr := s.egressTrace(c)
	cmd := workspace.Command{Script: script, Env: s.commandEnv(c, tr), Timeout: timeout, Combined: true}
	if p.Stdin != nil {
		cmd.Stdin = strings.NewReader(*p.Stdin)
	}
	if p.Background {
		return s.startBackground(ctx, p.Command, cmd, tr, cleanup)
	}
	defer cleanup()
	if tr != nil {
		defer tr.Close()
	}
	res, _, err := s.runCommand(ctx, c, tr, timeout, func(ctx context.Context, output func(workspace.Stream, []byte)) (workspace.Result, error) {
		cmd.Output = output
		return s.env.Bash.Run(ctx, cmd)
	})
	if sh := s.notBash(); err == nil && sh != "" {
		res.Text += "\n[" + noBashNote(sh) + "]"
	}
	return res, err
}

// notBash returns the shell that runs the bash tool's commands when the
// workspace says it is not bash (an image without one), else "". A shell
// the workspace does not name is taken to be bash, as promised.
func (s *Set) notBash() string {
	sh := workspace.ShellOf(s.env.Bash)
	if sh == "" || strings.HasPrefix(path.Base(sh), "bash") {
		return ""
	}
	return sh
}

// noBashNote is what the model is told, in the bash tool's description and
// in every answer, when the workspace has no bash.
func noBashNote(sh string) string {
	return "This workspace has no bash: commands are run by " + sh + ", a POSIX shell without bash's arrays, [[ ]], brace expansion or other bash-only syntax."
}

// runCommand runs a command through run, gathering its output (published
// as progress when the call asks), and returns the bash result: the kept
// tail, the whole output saved to the spill directory when cut, how the
// command ended and what egress decided for its connections (tr's, when
// not nil), with the text for the model.
func (s *Set) runCommand(ctx context.Context, c *call, tr EgressTrace, timeout time.Duration,
	run func(ctx context.Context, output func(workspace.Stream, []byte)) (workspace.Result, error)) (Result, *BashResult, error) {
	out := newCapture(ctx, s.cfg.MaxFileBytes, s.cfg.MaxBytes)
	var stop func()
	if c.opts.Progress != nil {
		stop = out.publish(time.Duration(s.cfg.ProgressMs)*time.Millisecond, func(stream, text string) {
			c.opts.Progress(Progress{Tool: c.tool, Stream: stream, Text: text})
		})
	}
	res, err := run(ctx, out.write)
	if stop != nil {
		stop()
	}
	if err != nil {
		return Result{}, nil, err
	}
	r := &BashResult{
		ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut,
		OutputBytes: out.total, DurationMs: res.Duration.Milliseconds(),
	}
	var notes []string
	r.Output, r.Truncated, r.OutputPath, r.SavedBytes, notes = s.keepOutput(ctx, out)
	tail := r.Output
	notes = append(notes, ending(res, timeout))
	if tr != nil {
		r.Egress = tr.Take(ctx, true)
		notes = append(notes, egressNotes(tr, r.Egress, tail)...)
	}
	return Result{Text: outputText(tail, notes), Structured: r}, r, nil
}

// ending is the note that says how a command ended.
func ending(res workspace.Result, timeout time.Duration) string {
	switch {
	case res.TimedOut:
		return fmt.Sprintf("[Timed out after %g s: the command and everything it started were killed.]", timeout.Seconds())
	case res.Signal != "":
		return fmt.Sprintf("[Killed by signal %s.]", res.Signal)
	default:
		return fmt.Sprintf("[Exit code %d.]", res.ExitCode)
	}
}

// outputText is a command's output for the model, followed by notes.
func outputText(output string, notes []string) string {
	if output == "" {
		output = "(no output)"
	}
	if !strings.HasSuffix(output, "\n") {
		output += "\n"
	}
	return output + "\n" + strings.Join(notes, "\n")
}

// keepOutput returns the tail of out that the model is shown and, when that
// is not all of it, saves the whole output to the spill directory: whether
// it was cut, where it went and how much of it, and a note saying so.
func (s *Set) keepOutput(ctx context.Context, out *capture) (tail string, truncated bool, outputPath string, saved int64, notes []string) {
	tail, tailLines := out.tail(s.cfg.MaxLines, s.cfg.MaxBytes)
	if int64(len(tail)) >= out.total {
		return tail, false, "", 0, nil
	}
	name, err := s.saveOutput(ctx, out.all)
	if err != nil {
		return tail, true, "", 0, []string{fmt.Sprintf("[Output cut to its last %d lines (%s of %s); saving the whole output failed: %v]", tailLines, kb(int64(len(tail))), kb(out.total), err)}
	}
	saved = int64(len(out.all))
	note := fmt.Sprintf("[Output cut to its last %d lines (%s of %s). The whole output is in %s; read it with read or grep.]", tailLines, kb(int64(len(tail))), kb(out.total), name)
	if saved < out.total {
		note = fmt.Sprintf("[Output cut to its last %d lines (%s of %s). Its first %s is in %s; the rest was over maxFileBytes and was not saved.]", tailLines, kb(int64(len(tail))), kb(out.total), kb(saved), name)
	}
	return tail, true, name, saved, []string{note}
}

// commandEnv is what a command gets on top of the adapter's base
// environment: its egress trace's variables (tr, when not nil), the
// session's variables, bashEnv, and the SANDBOXD_* variables when
// bashSessionEnv is set — a later one winning.
func (s *Set) commandEnv(c *call, tr EgressTrace) map[string]string {
	env := map[string]string{}
	if tr != nil {
		maps.Copy(env, tr.Env())
	}
	maps.Copy(env, s.env.Session.Vars)
	maps.Copy(env, s.cfg.BashEnv)
	if s.cfg.BashSessionEnv {
		env["SANDBOXD_SESSION_ID"] = s.env.Session.ID
		env["SANDBOXD_RUN_ID"] = c.runID
		env["SANDBOXD_WORKSPACE"] = s.root
	}
	return env
}

// saveOutput writes a command's whole output to a new file of the spill
// directory, removes all but the newest spillKeep there, and returns the
// file's workspace name.
func (s *Set) saveOutput(ctx context.Context, data []byte) (string, error) {
	dir := path.Clean(s.cfg.SpillDir)
	if err := workspace.Bookkeeping(ctx, s.env.FS, dir, 0o755); err != nil {
		return "", err
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := path.Join(dir, "bash-"+time.Now().UTC().Format("20060102-150405.000000000")+"-"+hex.EncodeToString(rnd[:])+".log")
	err := s.env.FS.WriteFile(ctx, name, data, 0o644)
	s.own(ctx, name)
	if err != nil {
		return "", err
	}
	s.spill.Lock()
	defer s.spill.Unlock()
	w, err := workspace.Walk(ctx, s.env.FS, workspace.WalkRequest{Dir: dir, Pattern: "bash-*.log", MaxDepth: 1, FilesOnly: true})
	if err != nil {
		return name, nil // saved; pruning waits for the next time
	}
	var spills []string // sorted by name, which is by time
	for _, e := range w.Entries {
		if e.Type.IsRegular() {
			spills = append(spills, e.Path)
		}
	}
	for _, n := range spills[:max(0, len(spills)-s.cfg.SpillKeep)] {
		err := s.env.FS.Remove(ctx, n)
		s.own(ctx, n)
		if err != nil && !errors.Is(err, workspace.ErrNotFound) {
			break
		}
	}
	return name, nil
}

// ProgressCap bounds the output of one stream that waits to be published as
// progress, and so the text of one Progress, whatever progressMs says. When
// a stream's pending output reaches it, it is published at once, and the
// command's output callback waits until it is: a progress receiver that is
// slow (an HTTP client that does not read its event stream) slows the
// command through its adapter's flow control, and never grows the daemon.
const ProgressCap = 64 << 10

// capture gathers a command's output: all of it up to a cap, its tail, and
// what is pending publication as progress (at most ProgressCap a stream).
type capture struct {
	ctx      context.Context
	mu       sync.Mutex
	room     *sync.Cond // signalled when progress is published, or ctx ends
	all      []byte     // the first max bytes
	max      int64
	total    int64
	last     []byte // the last keep bytes at least (all of them while few)
	keep     int
	pending  [3][]byte // by workspace.Stream, while publishing
	progress bool
	full     chan struct{} // a stream's pending output is at the cap: publish now
}

// newCapture returns a capture for a call's ctx: once ctx ends, a write
// waiting for progress to be published gives up waiting, and what does not
// fit is not published.
func newCapture(ctx context.Context, max int64, keep int) *capture {
	c := &capture{ctx: ctx, max: max, keep: keep, full: make(chan struct{}, 1)}
	c.room = sync.NewCond(&c.mu)
	return c
}

func (c *capture) write(s workspace.Stream, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := c.max - int64(len(c.all)); room > 0 {
		c.all = append(c.all, p[:min(int64(len(p)), room)]...)
	}
	c.last = append(c.last, p...)
	if len(c.last) > 2*c.keep {
		c.last = append(c.last[:0], c.last[len(c.last)-c.keep:]...)
	}
	if !c.progress || (s != workspace.Stdout && s != workspace.Stderr) {
		return
	}
	for {
		n := min(len(p), ProgressCap-len(c.pending[s]))
		c.pending[s] = append(c.pending[s], p[:n]...)
		if p = p[n:]; len(p) == 0 || !c.progress || c.ctx.Err() != nil {
			return
		}
		select {
		case c.full <- struct{}{}:
		default:
		}
		c.room.Wait()
	}
}

// tail returns the last maxLines lines within maxBytes of the output, cut
// to whole runes, and how many lines that is.
func (c *capture) tail(maxLines, maxBytes int) (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	src := c.last
	t := src[max(0, len(src)-maxBytes):]
	body := t
	if len(body) > 0 && body[len(body)-1] == '\n' {
		body = body[:len(body)-1]
	}
	lines := 0
	for i := len(body) - 1; i >= 0; i-- {
		if body[i] == '\n' {
			if lines++; lines == maxLines {
				t = t[i+1:]
				break
			}
		}
	}
	if int64(len(t)) < c.total {
		for len(t) > 0 && !utf8.RuneStart(t[0]) { // do not start inside a rune
			t = t[1:]
		}
	}
	n := bytes.Count(t, []byte("\n"))
	if len(t) > 0 && t[len(t)-1] != '\n' {
		n++
	}
	return string(t), n
}

// publish sends pending output to emit every interval, one event per stream
// with something new, until the returned stop function is called; stop
// sends what is left and returns once emit is done. Only whole runes are
// sent: a rune split between two writes waits for its end.
func (c *capture) publish(interval time.Duration, emit func(stream, text string)) (stop func()) {
	c.mu.Lock()
	c.progress = true
	c.mu.Unlock()
	stopWake := context.AfterFunc(c.ctx, func() {
		c.mu.Lock()
		c.room.Broadcast()
		c.mu.Unlock()
	})
	var emitMu sync.Mutex
	flush := func(final bool) {
		emitMu.Lock()
		defer emitMu.Unlock()
		for _, s := range []workspace.Stream{workspace.Stdout, workspace.Stderr} {
			c.mu.Lock()
			p := c.pending[s]
			n := len(p)
			if !final {
				n = validPrefix(p)
			}
			text := string(p[:n])
			c.pending[s] = append(p[:0], p[n:]...)
			c.room.Broadcast()
			c.mu.Unlock()
			if text != "" {
				emit(s.String(), strings.ToValidUTF8(text, "\uFFFD"))
			}
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				flush(false)
			case <-c.full:
				flush(false)
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		stopWake()
		c.mu.Lock()
		c.progress = false // a late write does not wait for a publisher that is gone
		c.room.Broadcast()
		c.mu.Unlock()
		flush(true)
	}
}
