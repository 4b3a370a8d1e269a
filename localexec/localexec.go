// Package localexec runs workspace commands on the local machine: the Bash
// port over a directory on the host.
//
//	sh, err := localexec.New("/path/to/workspace")
//	res, err := sh.Run(ctx, workspace.Command{Script: "go test ./...", Timeout: time.Minute})
//
// A script runs as `bash -c SCRIPT` (sh where there is no bash), an Argv
// without a shell. Each command runs in a process group of its own, with an
// environment built by workspace.CommandEnv: the host variables of the
// allowlist (workspace.DefaultEnvAllow unless configured), the session
// variables, then the command's own — never the host's other variables
// (tokens, keys) unless WithInheritEnv is set.
//
// At the timeout, when ctx ends, and also when the command's main process
// exits, its whole process tree is killed (see internal/proctree): on Linux
// every descendant — background jobs, nohup, double forks and processes that
// called setsid — because the command runs under a subreaper shim; on other
// systems (macOS) the command's process group only, so a process that leaves
// the group with setsid survives there, and Run stops waiting for output it
// holds open after proctree.DefaultWaitDelay.
//
// This adapter contains mistakes, not attacks: the command runs as the host
// user with the host's view of the file system and network. Dir confinement is
// a check of where the command starts; the command itself may cd anywhere.
// Run untrusted work in a container (the Docker adapters).
package localexec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/proctree"
	"github.com/sandboxd/sandboxd/workspace"
)

// Bash runs commands in a directory of the local machine. It is safe for
// concurrent use; commands run independently of each other.
type Bash struct {
	root    string // absolute
	shell   string // absolute path of the shell
	allow   []string
	inherit bool
	vars    map[string]string
	oomAdj  int
}

var _ workspace.Bash = (*Bash)(nil)

// Option configures a Bash.
type Option func(*Bash)

// WithEnvAllow sets the host variables commands see; an entry ending in "*"
// is a prefix. Nil keeps the default, workspace.DefaultEnvAllow; an empty
// list lets no host variable through.
func WithEnvAllow(names []string) Option {
	return func(b *Bash) {
		if names != nil {
			b.allow = slices.Clone(names)
		}
	}
}

// WithInheritEnv, when set, gives commands the host's whole environment,
// secrets included.
func WithInheritEnv(inherit bool) Option {
	return func(b *Bash) { b.inherit = inherit }
}

// WithEnv sets the session variables added to every command's environment
// (over the host's; a command's own Env wins over them).
func WithEnv(vars map[string]string) Option {
	return func(b *Bash) { b.vars = maps.Clone(vars) }
}

// WithShell sets the shell that runs scripts, as a path or a name looked up
// in the host's PATH. The default is bash, or sh where there is no bash.
func WithShell(path string) Option {
	return func(b *Bash) { b.shell = path }
}

// WithOOMScoreAdj sets the oom_score_adj of every command (Linux, -1000 to
// 1000; see proctree.Spec.OOMScoreAdj): 1000 makes the kernel kill a
// command, not the process that runs it, when memory runs out. Zero, the
// default, leaves the value commands inherit.
func WithOOMScoreAdj(n int) Option {
	return func(b *Bash) { b.oomAdj = n }
}

// New returns a Bash whose commands run in dir. It fails with ErrNotFound or
// ErrNotADirectory when dir is not a directory, and with ErrUnavailable when
// no shell is found.
func New(dir string, opts ...Option) (*Bash, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, &fs.PathError{Op: "localexec", Path: dir, Err: fmt.Errorf("%w: %v", workspace.ErrInvalidArgument, err)}
	}
	fi, err := os.Stat(abs)
	switch {
	case err != nil:
		return nil, &fs.PathError{Op: "localexec", Path: dir, Err: fmt.Errorf("%w: %v", kindOf(err), err)}
	case !fi.IsDir():
		return nil, workspace.PathError("localexec", dir, workspace.ErrNotADirectory)
	}
	b := &Bash{root: abs, allow: workspace.DefaultEnvAllow}
	for _, opt := range opts {
		opt(b)
	}
	shells := []string{"bash", "sh"}
	if b.shell != "" {
		shells = []string{b.shell}
	}
	for _, sh := range shells {
		if path, err := exec.LookPath(sh); err == nil {
			b.shell, err = filepath.Abs(path)
			if err == nil {
				return b, nil
			}
		}
	}
	return nil, &fs.PathError{Op: "localexec", Path: strings.Join(shells, ", "), Err: fmt.Errorf("%w: no shell found", workspace.ErrUnavailable)}
}

// Shell is the absolute path of the shell that runs scripts; see
// workspace.ShellBash.
func (b *Bash) Shell() string { return b.shell }

// Run runs cmd to its end; see workspace.Bash. A program of an Argv that is
// not found is a result, as in a shell: exit status 127 (126 when it is not
// executable) with a message on standard error.
func (b *Bash) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	return b.run(ctx, cmd, nil)
}

// run is Run, on a terminal of term's when term is not nil (RunTerminal).
func (b *Bash) run(ctx context.Context, cmd workspace.Command, term *workspace.Terminal) (workspace.Result, error) {
	argv, err := b.argv(cmd)
	if err != nil {
		return workspace.Result{}, err
	}
	dir, err := b.dir(cmd.Dir)
	if err != nil {
		return workspace.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return workspace.Result{}, err
	}
	vars := map[string]string{"PWD": dir} // as a shell that cd'd there would
	maps.Copy(vars, b.vars)
	maps.Copy(vars, cmd.Env)
	env := workspace.CommandEnv(os.Environ(), b.allow, b.inherit, vars)

	spec := proctree.Spec{Argv: argv, Dir: dir, Env: env, Stdin: cmd.Stdin, OOMScoreAdj: b.oomAdj}
	var out *output
	var tty *terminal
	switch {
	case term != nil:
		out = &output{fn: cmd.Output}
		if out.fn == nil {
			out.fn = func(workspace.Stream, []byte) {}
		}
		size := term.Size
		if term.Resize != nil {
			// A size asked for before the start: the program must never
			// run at the start's (Attach applies it only once it runs).
			size = term.Resize.Opening(size)
		}
		if tty, err = openTerminal(size, &spec); err != nil {
			return workspace.Result{}, &fs.PathError{Op: "run", Path: cmd.Dir, Err: fmt.Errorf("%w: a terminal: %v", workspace.ErrUnavailable, err)}
		}
		defer tty.close()
	case cmd.Output != nil:
		out = &output{fn: cmd.Output}
		spec.Stdout = streamWriter{out, workspace.Stdout}
		spec.Stderr = streamWriter{out, workspace.Stderr}
		if cmd.Combined {
			spec.Stderr = spec.Stdout // one pipe: proctree keeps the order
		}
	}
	p, err := proctree.Start(context.WithoutCancel(ctx), spec)
	if err != nil {
		return failed(cmd, out, err)
	}
	if tty != nil {
		tty.serve(out, cmd.Stdin, term.Resize)
	}
	// Whichever of the timeout and ctx comes first kills the tree, and is
	// the reason the command ended if it was still running.
	var cause atomic.Int32
	stop := context.AfterFunc(ctx, func() {
		if cause.CompareAndSwap(0, causeContext) {
			p.KillTree()
		}
	})
	defer stop()
	if cmd.Timeout > 0 {
		t := time.AfterFunc(cmd.Timeout, func() {
			if cause.CompareAndSwap(0, causeTimeout) {
				p.KillTree()
			}
		})
		defer t.Stop()
	}
	exit, err := p.Wait()
	if tty != nil {
		tty.drain(proctree.DefaultWaitDelay)
	}
	if err != nil && !errors.Is(err, proctree.ErrOutputHeld) {
		return failed(cmd, out, err)
	}
	res := workspace.Result{ExitCode: exit.Code, Signal: exit.Signal, Duration: exit.Duration}
	if exit.Killed {
		switch cause.Load() {
		case causeTimeout:
			res.TimedOut = true
		case causeContext:
			return res, ctx.Err()
		}
	}
	return res, nil
}

// Why Run killed a command.
const (
	causeTimeout = 1 + iota
	causeContext
)

// argv validates cmd and returns what to execute.
func (b *Bash) argv(cmd workspace.Command) ([]string, error) {
	invalid := func(why string) ([]string, error) {
		return nil, &fs.PathError{Op: "run", Path: cmd.Dir, Err: fmt.Errorf("%w: %s", workspace.ErrInvalidArgument, why)}
	}
	switch {
	case (cmd.Script == "") == (len(cmd.Argv) == 0):
		return invalid("exactly one of Script and Argv must be set")
	case len(cmd.Argv) > 0 && cmd.Argv[0] == "":
		return invalid("empty program name")
	case cmd.Timeout < 0:
		return invalid("negative timeout")
	case strings.IndexByte(cmd.Script, 0) >= 0:
		return invalid("NUL byte in Script")
	}
	for _, a := range cmd.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("NUL byte in Argv")
		}
	}
	for k, v := range cmd.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return invalid(fmt.Sprintf("bad environment variable %q", k))
		}
	}
	if cmd.Script != "" {
		return []string{b.shell, "-c", cmd.Script}, nil
	}
	return cmd.Argv, nil
}

// dir resolves a command's Dir, a workspace name, to a directory on disk.
// Symbolic links are followed only inside the workspace (os.Root).
func (b *Bash) dir(name string) (string, error) {
	rel, err := workspace.Resolve(filepath.ToSlash(b.root), name)
	if err != nil {
		return "", err
	}
	root, err := os.OpenRoot(b.root)
	if err != nil {
		return "", &fs.PathError{Op: "run", Path: name, Err: fmt.Errorf("%w: %v", workspace.ErrUnavailable, err)}
	}
	defer root.Close()
	fi, err := root.Stat(rel)
	switch {
	case err != nil:
		return "", workspace.PathError("run", name, kindOf(err))
	case !fi.IsDir():
		return "", workspace.PathError("run", name, workspace.ErrNotADirectory)
	}
	return filepath.Join(b.root, filepath.FromSlash(rel)), nil
}

// kindOf classifies an error of the file system. os.Root's only error that
// is not an errno is its refusal of a path that escapes the root.
func kindOf(err error) *workspace.Kind {
	var errno syscall.Errno
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return workspace.ErrNotFound
	case errors.Is(err, syscall.ENOTDIR):
		return workspace.ErrNotADirectory
	case errors.Is(err, fs.ErrPermission):
		return workspace.ErrForbidden
	case !errors.As(err, &errno):
		return workspace.ErrOutsideWorkspace
	}
	return workspace.ErrUnavailable
}

// failed turns a failure of proctree into a result or an error: a program
// of an Argv that cannot be executed ends like it would in a shell, anything
// else is the host's failure.
func failed(cmd workspace.Command, out *output, err error) (workspace.Result, error) {
	var pe *fs.PathError
	if len(cmd.Argv) > 0 && errors.As(err, &pe) && pe.Op == "exec" {
		code, msg := 126, "cannot execute"
		switch {
		case errors.Is(err, fs.ErrNotExist):
			code, msg = 127, "command not found"
		case errors.Is(err, fs.ErrPermission):
			msg = "permission denied"
		}
		if out != nil {
			s := workspace.Stderr
			if cmd.Combined {
				s = workspace.Stdout
			}
			out.fn(s, []byte(cmd.Argv[0]+": "+msg+"\n"))
		}
		return workspace.Result{ExitCode: code}, nil
	}
	kind := workspace.ErrUnavailable
	if errors.Is(err, syscall.EPERM) {
		kind = workspace.ErrForbidden
	}
	return workspace.Result{}, &fs.PathError{Op: "run", Path: cmd.Dir, Err: fmt.Errorf("%w: %v", kind, err)}
}

// output serialises the two streams' deliveries to Command.Output.
type output struct {
	mu sync.Mutex
	fn func(workspace.Stream, []byte)
}

type streamWriter struct {
	o *output
	s workspace.Stream
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.o.mu.Lock()
	defer w.o.mu.Unlock()
	w.o.fn(w.s, p)
	return len(p), nil
}
