package interp

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"

	"github.com/sandboxd/sandboxd/workspace"
)

// Defaults of Env's limits.
const (
	DefaultRoot         = "/workspace"
	DefaultMaxOutput    = 8 << 20
	DefaultMaxFileBytes = 64 << 20
	DefaultShellTimeout = 60 * time.Second
	// The interpreter runs in the daemon's process, outside every
	// container's CPU quota; these bound what one line, one session and one
	// tenant take of the daemon's CPUs.
	DefaultMaxSteps     = 10_000 // statements a line runs, loop rounds included
	DefaultSessionLines = 1      // lines of one session that run at once
	DefaultTenantLines  = 2      // lines of one tenant that run at once
)

// Env is the workspace the shell and the mutation operations work on.
type Env struct {
	// FS holds the workspace's files. Required.
	FS workspace.FileSystem
	// Session.Root is the working directory and the workspace root as
	// commands see it (pwd prints it; absolute paths under it are accepted);
	// DefaultRoot when empty. Session.Vars are visible as shell variables.
	Session workspace.Session
	// Protect are the globs every mutation refuses: the shell and the
	// mutation operations change files through workspace.Guard(FS, root,
	// Protect). nil means workspace.DefaultProtect; an empty, non-nil list
	// adds no guard (the tool set gives that, its FS being its guarded view
	// of the workspace already).
	Protect workspace.Protect
	// Exclude are the names recursive walks (find, grep -r, rg, ls -R) never
	// enter; nil means workspace.DefaultExclude.
	Exclude workspace.Exclude
	// MaxOutput bounds the bytes of stdout and stderr a line may produce; a
	// line that produces more is stopped there (Result.Truncated).
	MaxOutput int
	// MaxFileBytes is the largest file a command reads or a redirect writes.
	MaxFileBytes int64
	// Timeout bounds a whole command line (Result.TimedOut), the wait for a
	// slot (SessionLines, TenantLines) included.
	Timeout time.Duration
	// MaxSteps bounds the statements a line runs, every round of a loop
	// counted; a line past it is stopped with exit status 124. It bounds
	// the daemon's CPU time a line takes (well under a second at the default),
	// where Timeout bounds only its wall time.
	MaxSteps int64
	// SessionLines and TenantLines bound how many lines of Session.ID, and
	// of Session.Tenant, run at once in this process; others wait for a
	// slot. An empty ID or Tenant is not bounded.
	SessionLines, TenantLines int
	// Sources, when set, gives the shell a curl that sends the requests
	// of the workspace's API-backed sources through it (see cmdCurl).
	Sources SourceClient
}

func (e Env) root() string {
	if e.Session.Root == "" {
		return DefaultRoot
	}
	return e.Session.Root
}

// guarded is e with FS behind the guard of its protect globs, which it
// then has no more to apply.
func (e Env) guarded() Env {
	p := e.Protect
	if p == nil {
		p = workspace.DefaultProtect
	}
	e.FS, e.Protect = workspace.Guard(e.FS, e.root(), p), workspace.Protect{}
	return e
}

func (e Env) exclude() workspace.Exclude {
	if e.Exclude == nil {
		return workspace.DefaultExclude
	}
	return e.Exclude
}

func (e Env) maxFileBytes() int64 {
	if e.MaxFileBytes <= 0 {
		return DefaultMaxFileBytes
	}
	return e.MaxFileBytes
}

// Result is how a command line ended. A line that ran is a Result, whatever
// its exit status.
type Result struct {
	Stdout, Stderr string
	// ExitCode is the status of the last command, as in a shell; 124 when the
	// line timed out.
	ExitCode int
	// Truncated says the line produced more than Env.MaxOutput bytes and was
	// stopped there.
	Truncated bool
	// TimedOut says the line ran past Env.Timeout and was stopped.
	TimedOut bool
}

var (
	errOutputFull = errors.New("output limit reached")
	errTimedOut   = errors.New("command line timed out")
	errSteps      = errors.New("command line ran past its steps")
)

// lineSlots bounds the lines running at once per session and per tenant.
var lineSlots = slots{held: map[string]*slot{}}

// slots are counting semaphores by key, made on first use and dropped when
// no line holds or waits for them.
type slots struct {
	mu   sync.Mutex
	held map[string]*slot
}

type slot struct {
	c     chan struct{}
	users int
}

// take waits for a slot of sess's session (n of them) and then of its tenant
// (m), and returns their release; false when ctx ended first.
func (s *slots) take(ctx context.Context, sess workspace.Session, n, m int) (release func(), ok bool) {
	var taken []string
	release = func() {
		for _, k := range taken {
			s.put(k)
		}
	}
	for _, k := range []struct {
		key string
		n   int
	}{{"session " + sess.ID, n}, {"tenant " + sess.Tenant, m}} {
		if strings.HasSuffix(k.key, " ") {
			continue // no ID or tenant: not bounded
		}
		if !s.get(ctx, k.key, k.n) {
			release()
			return nil, false
		}
		taken = append(taken, k.key)
	}
	return release, true
}

func (s *slots) get(ctx context.Context, key string, n int) bool {
	s.mu.Lock()
	sl := s.held[key]
	if sl == nil {
		sl = &slot{c: make(chan struct{}, n)}
		s.held[key] = sl
	}
	sl.users++
	s.mu.Unlock()
	select {
	case sl.c <- struct{}{}:
		return true
	case <-ctx.Done():
		s.drop(key, sl)
		return false
	}
}

func (s *slots) put(key string) {
	s.mu.Lock()
	sl := s.held[key]
	s.mu.Unlock()
	<-sl.c
	s.drop(key, sl)
}

func (s *slots) drop(key string, sl *slot) {
	s.mu.Lock()
	if sl.users--; sl.users == 0 {
		delete(s.held, key)
	}
	s.mu.Unlock()
}

// Run runs one command line of the shell tool in the workspace.
//
// The line is parsed as Bash and every command in it — inside substitutions,
// subshells, groups, loops and pipelines too — is checked against mode's
// allowlist before anything runs (see Check); a refused line fails with a
// *RefusedError (workspace.ErrForbidden) and changes nothing. An accepted
// line is interpreted in this process: the commands are implemented over
// env.FS, so a line behaves the same on every backend, and no process is
// started. Read mode changes no file. In write mode, mkdir, touch, cp, mv, rm
// and output redirections change files under the guardrails of the mutation
// operations (confinement, protect globs, atomic writes).
//
// The working directory is the workspace root and cannot change. Pipes, &&,
// ||, ;, !, subshells, { groups }, if, while, until and for loops, command
// and arithmetic substitution, globbing, brace and tilde expansion, here
// documents and here strings, < input, 2>&1-style duplications and /dev/null
// work as in Bash. A redirected file is written when its command ends (so
// `cat f > f` keeps f).
//
// A command that is refused only once its arguments are expanded
// (`find . $(echo -delete)`) stops the line with a *RefusedError, returned
// with the Result so far. When ctx ends, Run returns the Result so far and
// ctx's error.
func Run(ctx context.Context, env Env, line string, mode Mode) (Result, error) {
	if env.FS == nil {
		return Result{}, workspace.Errorf(workspace.ErrInvalidArgument, "shell: no workspace file system")
	}
	env = env.guarded()
	mode = mode.OrRead()
	if mode != Read && mode != Write {
		return Result{}, workspace.Errorf(workspace.ErrInvalidArgument, "shell: %q is not a mode", string(mode))
	}
	f, err := Parse(line)
	if err != nil {
		return Result{}, err
	}
	if err := check(f, mode, env.Sources != nil); err != nil {
		return Result{}, err
	}
	timeout := env.Timeout
	if timeout <= 0 {
		timeout = DefaultShellTimeout
	}
	parent := ctx
	ctx, cancelTimeout := context.WithTimeoutCause(ctx, timeout, errTimedOut)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	max := env.MaxOutput
	if max <= 0 {
		max = DefaultMaxOutput
	}
	r := &runner{env: env, mode: mode, root: env.root(), cancel: cancel, left: max, noInput: strings.NewReader(""),
		steps: cmp.Or(env.MaxSteps, DefaultMaxSteps)}
	stopPipes := context.AfterFunc(ctx, r.closePipes)
	defer stopPipes()
	stdout, stderr := &capture{r: r}, &capture{r: r}
	status := 0
	if release, ok := lineSlots.take(ctx, env.Session, cmp.Or(env.SessionLines, DefaultSessionLines), cmp.Or(env.TenantLines, DefaultTenantLines)); ok {
		sh := &shell{vars: map[string]string{}}
		status = r.stmts(ctx, sh, f.Stmts, stdio{in: r.noInput, out: stdout, err: stderr})
		release()
	}

	res := Result{ExitCode: status}
	cause := context.Cause(ctx)
	switch {
	case cause == nil:
	case errors.Is(cause, errSteps):
		res.ExitCode = 124
		stderr.note(fmt.Sprintf("shell: the command line was stopped after %d statements, its CPU budget; use bash for long loops\n", r.steps))
	case errors.Is(cause, errOutputFull):
		res.Truncated = true
		stderr.note(fmt.Sprintf("shell: output stopped after %d bytes\n", max))
	case parent.Err() != nil:
		res.Stdout, res.Stderr = stdout.String(), stderr.String()
		return res, parent.Err()
	case errors.Is(cause, errTimedOut):
		res.TimedOut, res.ExitCode = true, 124
		stderr.note(fmt.Sprintf("shell: the command line timed out after %s\n", timeout))
	default: // a refusal found while running
		res.Stdout, res.Stderr = stdout.String(), stderr.String()
		return res, cause
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	return res, nil
}

type runner struct {
	env    Env
	mode   Mode
	root   string
	cancel context.CancelCauseFunc
	// noInput is the line's own standard input: empty, and not a pipe, so
	// rg searches the working directory rather than it.
	noInput io.Reader

	mu     sync.Mutex
	left   int // output bytes still allowed
	pipes  []*io.PipeReader
	closed bool

	steps int64        // the line's budget of statements
	ran   atomic.Int64 // statements run so far
}

// stop ends the line with cause (a refusal, or errOutputFull).
func (r *runner) stop(cause error) { r.cancel(cause) }

// pipe returns a pipe that is closed when the line ends.
func (r *runner) pipe() (*io.PipeReader, *io.PipeWriter) {
	pr, pw := io.Pipe()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		pr.CloseWithError(context.Canceled)
	}
	r.pipes = append(r.pipes, pr)
	return pr, pw
}

func (r *runner) closePipes() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, p := range r.pipes {
		p.CloseWithError(context.Canceled)
	}
}

// capture is the line's stdout or stderr; both share the runner's budget.
type capture struct {
	r   *runner
	buf bytes.Buffer
}

func (c *capture) Write(p []byte) (int, error) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	n := min(len(p), c.r.left)
	c.buf.Write(p[:n])
	c.r.left -= n
	if n < len(p) {
		c.r.stop(errOutputFull)
		return n, errOutputFull
	}
	return n, nil
}

func (c *capture) note(s string) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.buf.WriteString(s)
}

func (c *capture) String() string {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	return c.buf.String()
}

// shell is the state a subshell copies: variables and the last status.
type shell struct {
	vars   map[string]string
	status int
}

func (sh *shell) clone() *shell {
	vars := make(map[string]string, len(sh.vars))
	for k, v := range sh.vars {
		vars[k] = v
	}
	return &shell{vars: vars, status: sh.status}
}

type stdio struct {
	in       io.Reader
	out, err io.Writer
}

func (r *runner) stmts(ctx context.Context, sh *shell, list []*syntax.Stmt, sio stdio) int {
	status := 0
	for _, st := range list {
		if ctx.Err() != nil {
			return 1
		}
		status = r.stmt(ctx, sh, st, sio)
	}
	return status
}

func (r *runner) stmt(ctx context.Context, sh *shell, st *syntax.Stmt, sio stdio) int {
	if r.ran.Add(1) > r.steps {
		r.stop(errSteps)
		return 124
	}
	sio, sinks, status := r.redirect(ctx, sh, st.Redirs, sio)
	if status == 0 {
		status = r.command(ctx, sh, st.Cmd, sio)
	}
	for _, s := range sinks {
		if err := s.commit(ctx, r); err != nil {
			fmt.Fprintf(sio.err, "shell: %s\n", describeErr(s.arg, err))
			status = 1
		}
	}
	if st.Negated {
		status = boolStatus(status != 0)
	}
	sh.status = status
	return status
}

func boolStatus(ok bool) int {
	if ok {
		return 0
	}
	return 1
}

func (r *runner) command(ctx context.Context, sh *shell, cmd syntax.Command, sio stdio) int {
	switch c := cmd.(type) {
	case nil:
		return 0
	case *syntax.CallExpr:
		args, err := r.fields(ctx, sh, sio, c.Args...)
		if err != nil {
			fmt.Fprintf(sio.err, "shell: %v\n", err)
			return 1
		}
		if len(args) == 0 {
			return 0
		}
		return r.dispatch(ctx, args, sio)
	case *syntax.BinaryCmd:
		switch c.Op {
		case syntax.AndStmt, syntax.OrStmt:
			status := r.stmt(ctx, sh, c.X, sio)
			if (status == 0) == (c.Op == syntax.AndStmt) {
				status = r.stmt(ctx, sh, c.Y, sio)
			}
			return status
		default: // Pipe, PipeAll
			pr, pw := r.pipe()
			left := sio
			left.out = pw
			if c.Op == syntax.PipeAll {
				left.err = pw
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.stmt(ctx, sh.clone(), c.X, left)
				pw.Close()
			}()
			right := sio
			right.in = pr
			status := r.stmt(ctx, sh.clone(), c.Y, right)
			pr.CloseWithError(io.ErrClosedPipe) // the left side stops writing, as on SIGPIPE
			<-done
			return status
		}
	case *syntax.Subshell:
		return r.stmts(ctx, sh.clone(), c.Stmts, sio)
	case *syntax.Block:
		return r.stmts(ctx, sh, c.Stmts, sio)
	case *syntax.IfClause:
		for ; c != nil; c = c.Else {
			if len(c.Cond) == 0 { // else
				return r.stmts(ctx, sh, c.Then, sio)
			}
			if r.stmts(ctx, sh, c.Cond, sio) == 0 {
				return r.stmts(ctx, sh, c.Then, sio)
			}
		}
		return 0
	case *syntax.WhileClause:
		status := 0
		for ctx.Err() == nil {
			if (r.stmts(ctx, sh, c.Cond, sio) == 0) == c.Until {
				break
			}
			status = r.stmts(ctx, sh, c.Do, sio)
		}
		return status
	case *syntax.ForClause:
		wi, ok := c.Loop.(*syntax.WordIter)
		if !ok {
			return r.refuse("for", "this loop is not supported")
		}
		items, err := r.fields(ctx, sh, sio, wi.Items...)
		if err != nil {
			fmt.Fprintf(sio.err, "shell: %v\n", err)
			return 1
		}
		status := 0
		for _, item := range items {
			if ctx.Err() != nil {
				break
			}
			sh.vars[wi.Name.Value] = item
			status = r.stmts(ctx, sh, c.Do, sio)
		}
		return status
	}
	// check refuses every other construct; this is a second lock.
	return r.refuse(fmt.Sprintf("%T", cmd), "this construct is not supported")
}

// refuse stops the line with a refusal found while running; it returns the
// status of the refused command.
func (r *runner) refuse(what, why string) int {
	r.stop(refused(what, why))
	return 126
}

// expandConfig is a fresh expansion context: expand.Config keeps state and is
// not safe for concurrent use, and pipeline stages run concurrently.
func (r *runner) expandConfig(ctx context.Context, sh *shell, sio stdio) *expand.Config {
	return &expand.Config{
		Env: envView{r: r, sh: sh},
		CmdSubst: func(w io.Writer, cs *syntax.CmdSubst) error {
			return r.cmdSubst(ctx, sh, cs, w, sio)
		},
		ReadDir2: func(p string) ([]fs.DirEntry, error) {
			name, err := workspace.Resolve(r.root, p)
			if err != nil {
				return nil, fs.ErrNotExist // a glob outside the workspace matches nothing
			}
			return r.env.FS.ReadDir(ctx, name)
		},
	}
}

func (r *runner) fields(ctx context.Context, sh *shell, sio stdio, words ...*syntax.Word) ([]string, error) {
	out, err := expand.Fields(r.expandConfig(ctx, sh, sio), words...)
	if cause := context.Cause(ctx); cause != nil {
		return nil, cause
	}
	return out, err
}

// word expands a redirection's word the way Bash does: one field after
// quote removal and expansions; a here-string's fields are joined.
func (r *runner) word(ctx context.Context, sh *shell, sio stdio, w *syntax.Word, join bool) (string, error) {
	fields, err := r.fields(ctx, sh, sio, w)
	if err != nil {
		return "", err
	}
	if join {
		return strings.Join(fields, " "), nil
	}
	if len(fields) != 1 {
		return "", fmt.Errorf("%s: ambiguous redirect", wordText(w))
	}
	return fields[0], nil
}

// cmdSubst runs $(…) in a subshell, its output going to w (bounded like the
// line's output). $(<file) reads the file.
func (r *runner) cmdSubst(ctx context.Context, sh *shell, cs *syntax.CmdSubst, w io.Writer, sio stdio) error {
	lw := &limitWriter{w: w, left: r.env.maxFileBytes()}
	if len(cs.Stmts) == 1 {
		st := cs.Stmts[0]
		if st.Cmd == nil && len(st.Redirs) == 1 && st.Redirs[0].Op == syntax.RdrIn {
			in, _, status := r.redirect(ctx, sh, st.Redirs, stdio{out: lw, err: sio.err})
			if status == 0 {
				_, err := copyCtx(ctx, lw, in.in)
				return err
			}
			return nil
		}
	}
	sub := sh.clone()
	r.stmts(ctx, sub, cs.Stmts, stdio{in: sio.in, out: lw, err: sio.err})
	sh.status = sub.status
	return context.Cause(ctx)
}

type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, workspace.Errorf(workspace.ErrFileTooLarge, "output over %d bytes", l.left)
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}

// envView shows the shell's variables to the expand package. There are no
// exported variables: nothing reaches a process, since none is started.
type envView struct {
	r  *runner
	sh *shell
}

func (e envView) Get(name string) expand.Variable {
	str := func(s string) expand.Variable { return expand.Variable{Set: true, Kind: expand.String, Str: s} }
	switch name {
	case "?":
		return str(strconv.Itoa(e.sh.status))
	case "#":
		return str("0")
	case "0":
		return str("bash")
	case "PWD", "HOME":
		return str(e.r.root)
	}
	if user, ok := strings.CutPrefix(name, "HOME "); ok {
		return str("~" + user) // ~user stays as written: no user database is read
	}
	if v, ok := e.sh.vars[name]; ok {
		return str(v)
	}
	if v, ok := e.r.env.Session.Vars[name]; ok {
		return str(v)
	}
	return expand.Variable{}
}

func (e envView) Each(f func(name string, vr expand.Variable) bool) {
	for _, n := range []string{"PWD", "HOME"} {
		if !f(n, e.Get(n)) {
			return
		}
	}
	for k := range e.r.env.Session.Vars {
		if !f(k, e.Get(k)) {
			return
		}
	}
	for k := range e.sh.vars {
		if !f(k, e.Get(k)) {
			return
		}
	}
}

// sink collects a redirected command's output for a file, written when the
// command ends.
type sink struct {
	arg    string // as written, for messages
	name   string
	append bool
	mu     sync.Mutex
	buf    bytes.Buffer
	max    int64
	over   bool
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int64(s.buf.Len()+len(p)) > s.max {
		s.over = true
		return 0, workspace.Errorf(workspace.ErrFileTooLarge, "%s: over %d bytes", s.arg, s.max)
	}
	return s.buf.Write(p)
}

func (s *sink) commit(ctx context.Context, r *runner) error {
	if s.over {
		return workspace.Errorf(workspace.ErrFileTooLarge, "more than %d bytes", s.max)
	}
	m := r.mutator()
	if s.append {
		_, _, err := m.AppendFile(ctx, s.name, s.buf.Bytes(), false)
		return err
	}
	_, err := m.WriteFile(ctx, s.name, s.buf.Bytes(), false)
	return err
}

// redirect applies a statement's redirections to io, in order. A failure is
// reported on stderr and gives status 1; the command then does not run.
func (r *runner) redirect(ctx context.Context, sh *shell, rds []*syntax.Redirect, sio stdio) (stdio, []*sink, int) {
	var sinks []*sink
	fail := func(format string, args ...any) (stdio, []*sink, int) {
		fmt.Fprintf(sio.err, "shell: "+format+"\n", args...)
		return sio, nil, 1
	}
	for _, rd := range rds {
		fd := 1
		switch rd.Op {
		case syntax.RdrIn, syntax.DplIn, syntax.Hdoc, syntax.DashHdoc, syntax.WordHdoc:
			fd = 0
		}
		if rd.N != nil {
			fd, _ = strconv.Atoi(rd.N.Value)
		}
		if fd < 0 || fd > 2 {
			return sio, nil, r.refuse(rd.N.Value+rd.Op.String(), "only file descriptors 0, 1 and 2 can be redirected")
		}
		switch rd.Op {
		case syntax.Hdoc, syntax.DashHdoc:
			body, err := r.hdoc(ctx, sh, sio, rd)
			if err != nil {
				return fail("here-document: %v", err)
			}
			sio.in = strings.NewReader(body)
			continue
		}
		arg, err := r.word(ctx, sh, sio, rd.Word, rd.Op == syntax.WordHdoc)
		if err != nil {
			return fail("%v", err)
		}
		switch rd.Op {
		case syntax.WordHdoc:
			sio.in = strings.NewReader(arg + "\n")
		case syntax.DplOut, syntax.DplIn:
			var w io.Writer
			switch arg {
			case "0":
				continue
			case "1":
				w = sio.out
			case "2":
				w = sio.err
			case "-":
				if fd == 0 {
					sio.in = strings.NewReader("")
					continue
				}
				w = io.Discard
			default:
				return sio, nil, r.refuse(rd.Op.String()+arg, "only 0, 1, 2 and - can be duplicated")
			}
			if fd == 2 {
				sio.err = w
			} else {
				sio.out = w
			}
		case syntax.RdrIn:
			if arg == devNull {
				sio.in = strings.NewReader("")
				continue
			}
			name, err := workspace.Resolve(r.root, arg)
			if err != nil {
				return fail("%s", describeErr(arg, err))
			}
			data, err := r.env.FS.ReadFile(ctx, name, r.env.maxFileBytes())
			if err != nil {
				return fail("%s", describeErr(arg, err))
			}
			sio.in = bytes.NewReader(data)
		case syntax.RdrOut, syntax.RdrClob, syntax.AppOut, syntax.RdrAll, syntax.AppAll:
			var w io.Writer = io.Discard
			if arg != devNull {
				if r.mode != Write {
					return sio, nil, r.refuse(rd.Op.String()+" "+arg, "output redirection writes a file, and read mode changes no file")
				}
				name, err := r.mutator().Target(ctx, arg)
				if err != nil {
					return fail("%s", describeErr(arg, err))
				}
				if info, err := r.env.FS.Stat(ctx, name); err == nil && info.IsDir() {
					return fail("%s: Is a directory", arg)
				}
				s := &sink{arg: arg, name: name, append: rd.Op == syntax.AppOut || rd.Op == syntax.AppAll, max: r.env.maxFileBytes()}
				sinks = append(sinks, s)
				w = s
			}
			switch {
			case rd.Op == syntax.RdrAll || rd.Op == syntax.AppAll:
				sio.out, sio.err = w, w
			case fd == 2:
				sio.err = w
			default:
				sio.out = w
			}
		default:
			return sio, nil, r.refuse(rd.Op.String(), "this redirection is not supported")
		}
	}
	return sio, sinks, 0
}

// hdoc returns a here-document's body: literal when its delimiter is quoted,
// expanded otherwise; <<- strips leading tabs.
func (r *runner) hdoc(ctx context.Context, sh *shell, sio stdio, rd *syntax.Redirect) (string, error) {
	if rd.Hdoc == nil {
		return "", nil
	}
	quoted := false
	for _, p := range rd.Word.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			quoted = quoted || strings.Contains(p.Value, `\`)
		case *syntax.SglQuoted, *syntax.DblQuoted:
			quoted = true
		}
	}
	doc := func(w *syntax.Word) (string, error) {
		if quoted {
			if lit := w.Lit(); lit != "" || len(w.Parts) == 0 {
				return lit, nil
			}
		}
		s, err := expand.Document(r.expandConfig(ctx, sh, sio), w)
		if cause := context.Cause(ctx); cause != nil {
			return "", cause
		}
		return s, err
	}
	if rd.Op != syntax.DashHdoc {
		return doc(rd.Hdoc)
	}
	var b strings.Builder
	var cur []syntax.WordPart
	flush := func() error {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		s, err := doc(&syntax.Word{Parts: cur})
		b.WriteString(s)
		cur = nil
		return err
	}
	for _, wp := range rd.Hdoc.Parts {
		lit, ok := wp.(*syntax.Lit)
		if !ok {
			cur = append(cur, wp)
			continue
		}
		for i, part := range strings.Split(lit.Value, "\n") {
			if i > 0 {
				if err := flush(); err != nil {
					return "", err
				}
			}
			cur = append(cur, &syntax.Lit{Value: strings.TrimLeft(part, "\t")})
		}
	}
	if err := flush(); err != nil {
		return "", err
	}
	return b.String(), nil
}

// dispatch runs one command of the allowlist.
func (r *runner) dispatch(ctx context.Context, args []string, sio stdio) int {
	name := args[0]
	if !allowed(name, r.mode, r.env.Sources != nil) {
		return r.refuse(name, notAllowedWhy(name, r.mode))
	}
	for _, a := range args[1:] {
		if why := forbiddenArg(name, a); why != "" {
			return r.refuse(name+" "+a, why)
		}
	}
	c := &call{r: r, ctx: ctx, name: name, args: args[1:], in: sio.in, errw: sio.err}
	c.out = bufio.NewWriterSize(sio.out, 32<<10)
	status := commands[name](c)
	c.out.Flush()
	return status
}
