// Package proctree runs a command so that nothing it starts outlives it.
//
// Start runs a program in a process group of its own. When the program exits,
// when the caller calls KillTree, or when the context given to Start ends, the
// program's whole process tree is killed, and Wait returns only once it is gone
// and its output has been delivered:
//
//	p, err := proctree.Start(ctx, proctree.Spec{Argv: []string{"bash", "-c", script}, Stdout: w})
//	if err != nil { … }
//	exit, err := p.Wait()
//
// What "whole tree" means depends on the system:
//
//   - On Linux the program runs under a shim: the current executable, started
//     again through /proc/self/exe, becomes a child subreaper
//     (PR_SET_CHILD_SUBREAPER), so every process the program starts stays its
//     descendant — background jobs, nohup, double forks and setsid included.
//     When the program ends or the tree is killed, the shim sends SIGKILL to
//     every descendant it finds in /proc, reaps them, and repeats until it has
//     no children left. The shim dies with its parent (PR_SET_PDEATHSIG), and
//     kills the tree first when it can. The shim runs as the command's user,
//     so a program may stop it (kill -STOP $PPID, again and again): from the
//     moment the tree is to die until the shim reports it gone, the parent
//     too kills every descendant of the shim it finds in /proc, every 50 ms,
//     and continues the shim, so a stopped shim cannot keep the tree alive. A shim whose tree is gone serves
//     the next command (the idle ones are kept, see CloseIdle), so that a
//     command costs a fork and exec rather than the start of a second Go
//     program; one that was told to kill its tree, or whose resource
//     limits, niceness or oom_score_adj a command changed, serves no other.
//     The shim is this package's init function: any binary that links
//     proctree can act as one, with no change to its main. Initialisers of packages proctree does not import may run
//     before it in the shim too, so they must have no side effects.
//     A process that already adopts every orphan below it — the init of a
//     container — may say so with AdoptOrphans: a command that runs while no
//     other does then runs without a shim, and its end kills every
//     descendant of the process outside the trees of live shims.
//   - Elsewhere (macOS) only the program's process group is killed. A process
//     that leaves the group (setsid, or a shell's job control) survives, and if
//     it keeps the output open Wait gives up waiting for it after WaitDelay.
//
// Not covered anywhere: processes started on the command's behalf by other
// services (systemd-run, at, a container engine), processes the caller may
// not signal (setuid programs), processes stuck in uninterruptible sleep,
// which die only when the kernel lets them, and — the shim runs as the same
// user as the command — processes that left the group after the command
// SIGKILLed its own shim. Wait still returns: the parent kills a shim that
// has not finished five seconds after the tree was to die (reporting the
// program killed when it was asked to kill it), and stops waiting for output
// WaitDelay after that.
package proctree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultWaitDelay is how long Wait waits for the output pipes to close after
// the process tree is gone, when Spec.WaitDelay is zero.
const DefaultWaitDelay = 2 * time.Second

// killGrace is how long the parent lets the shim clean up after it was told to
// (or after the program ended) before it kills the shim itself.
const killGrace = 5 * time.Second

// readyTimeout is how long Start waits for a new shim to say it is ready.
// Nothing the program does can delay that (the program starts after), so
// only a hang in the binary's initialisers should trip it — not a loaded
// machine, where a large (or race-built) binary may take seconds to start.
const readyTimeout = time.Minute

// ErrOutputHeld is returned by Wait, with a valid Exit, when the output pipes
// were still open WaitDelay after the process tree was gone: a process outside
// the tree holds them. The output read until then was delivered.
var ErrOutputHeld = errors.New("proctree: output still held open after the process tree ended")

// Spec describes a command to start.
type Spec struct {
	// Argv is the program and its arguments. A program name without a slash
	// is looked up in the PATH of Env, as execvp does (and in /usr/local/bin,
	// /usr/bin and /bin when Env has no PATH); a name with a slash is relative
	// to Dir.
	Argv []string
	// Dir is the working directory; "" is the caller's.
	Dir string
	// Env is the command's whole environment.
	Env []string
	// Stdin is the command's standard input; nil is empty input. An *os.File
	// is handed to the command as it is; any other reader is copied into a
	// pipe by a goroutine, and the command sees end of input when Read
	// returns an error (io.EOF). A reader whose Read blocks after the command
	// ended keeps that goroutine until Read returns.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output; nil discards it. An
	// *os.File is handed to the command as it is. Any other writer is written
	// by a goroutine of its own as output arrives, so the two may be called
	// concurrently; a writer's first error is returned by Wait, and the rest
	// of that stream is discarded. When Stderr is Stdout (the same value,
	// compared with ==, as os/exec does), the command gets one pipe for
	// both, as with 2>&1: one goroutine writes it, in the order the command
	// wrote, and which stream a byte came from is not known.
	Stdout, Stderr io.Writer
	// WaitDelay bounds how long Wait waits for output after the process tree
	// is gone; zero means DefaultWaitDelay.
	WaitDelay time.Duration
	// OOMScoreAdj, when not zero, is written to the command's
	// /proc/PID/oom_score_adj (Linux; -1000 to 1000), so that the kernel
	// picks the command, not its parent, when memory runs out: any process
	// may raise the value, lowering it below the caller's takes
	// CAP_SYS_RESOURCE. Best effort: a value that cannot be set is not.
	// Under the shim, and for a command run directly by a process that
	// adopts orphans, the program inherits it from its start, and so does
	// all it starts; a command run in a process group only (other systems)
	// gets it just after it started, so what it forks in those
	// microseconds keeps the caller's value.
	OOMScoreAdj int
	// Terminal starts the program in a session of its own (setsid), with
	// Stdin, which must then be an *os.File, as its controlling terminal
	// (TIOCSCTTY): a pseudo-terminal's slave side, typically Stdout and
	// Stderr too. Its session's process group is the program's group, and
	// the tree is killed as any other (the group, and under the shim or
	// AdoptOrphans every descendant). A tty's hangup (SIGHUP to the
	// foreground group when the program ends) changes nothing of that.
	Terminal bool

	direct bool // tests: use the process-group implementation on Linux too
}

// Exit says how a command's main process ended.
type Exit struct {
	// Code is the exit status, or -1 when a signal killed the process.
	Code int
	// Signal names the signal that killed it ("SIGKILL"), or is empty.
	Signal string
	// Killed is set when the tree was killed (KillTree, or the context)
	// while the main process was still running, and that killed it.
	Killed bool
	// Duration is how long the main process ran.
	Duration time.Duration
}

// tree is a started command: the shim on Linux, a process group elsewhere.
type tree interface {
	// kill starts killing the whole tree and returns at once. It may be
	// called any number of times, concurrently with wait.
	kill()
	// wait returns once the main process has ended and the tree is gone, as
	// far as the implementation can tell.
	wait() (Exit, error)
}

// Process is a started command. Its methods are safe for concurrent use;
// Wait must be called exactly once.
type Process struct {
	tree      tree
	waitDelay time.Duration

	stdin   *os.File   // our end of the stdin pipe, nil when none
	outputs []*os.File // our ends of the output pipes
	pumps   sync.WaitGroup

	errMu    sync.Mutex
	writeErr error // first error of an output writer

	done   chan struct{} // closed when Wait has seen the tree end
	waited sync.Once
}

// Start starts the command described by spec. When ctx ends before the
// command does, its tree is killed, as by KillTree. Start fails with an
// *fs.PathError whose Op is "exec" when the program cannot be executed (its
// Err matches fs.ErrNotExist when it is not found, fs.ErrPermission when it is
// not executable), and with another error when the system would not start it.
func Start(ctx context.Context, spec Spec) (*Process, error) {
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, errors.New("proctree: empty Argv")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path, err := lookPath(spec.Argv[0], spec.Env, spec.Dir)
	if err != nil {
		return nil, &fs.PathError{Op: "exec", Path: spec.Argv[0], Err: err}
	}
	spec.Env = withoutMarker(spec.Env)
	if _, ok := spec.Stdin.(*os.File); spec.Terminal && !ok {
		return nil, errors.New("proctree: a terminal's Stdin must be an *os.File, the terminal")
	}

	p := &Process{waitDelay: spec.WaitDelay, done: make(chan struct{})}
	if p.waitDelay <= 0 {
		p.waitDelay = DefaultWaitDelay
	}
	stdio, writers, opened, err := p.openStdio(spec)
	defer closeAll(opened) // the child's ends: it has its own copies now
	if err != nil {
		p.closeOurs()
		return nil, err
	}
	if spec.direct {
		p.tree, err = startDirect(path, spec, stdio)
	} else {
		p.tree, err = startTree(path, spec, stdio)
	}
	if err != nil {
		p.closeOurs()
		return nil, err
	}
	if p.stdin != nil {
		go copyStdin(p.stdin, spec.Stdin)
	}
	for i, r := range p.outputs {
		p.pumps.Add(1)
		go p.pump(r, writers[i])
	}
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				p.KillTree()
			case <-p.done:
			}
		}()
	}
	return p, nil
}

// KillTree starts killing the command's whole process tree and returns at
// once; Wait reports when it is gone. It does nothing once the tree has ended.
func (p *Process) KillTree() {
	select {
	case <-p.done:
	default:
		p.tree.kill()
	}
}

// Wait waits for the command's main process to end and for its process tree
// to be gone, then for the output pipes to reach end of file (at most
// WaitDelay more), and returns how the main process ended. The Exit is valid
// even when Wait also returns ErrOutputHeld or an output writer's error. An
// *fs.PathError with Op "exec" says that the program could not be executed
// after all (Start checks it, but the file may change in between). Any other
// error means the outcome is not known. No output writer is called after Wait
// returns.
func (p *Process) Wait() (Exit, error) {
	err := errors.New("proctree: Wait called twice")
	var exit Exit
	p.waited.Do(func() {
		exit, err = p.tree.wait()
		close(p.done)
		if p.stdin != nil {
			p.stdin.Close() // unblocks a copy stuck on a full pipe
		}
		drained := make(chan struct{})
		go func() { p.pumps.Wait(); close(drained) }()
		t := time.NewTimer(p.waitDelay)
		defer t.Stop()
		select {
		case <-drained:
		case <-t.C:
			closeAll(p.outputs) // the pumps' reads fail now
			<-drained
			if err == nil {
				err = ErrOutputHeld
			}
		}
		p.errMu.Lock()
		if err == nil {
			err = p.writeErr
		}
		p.errMu.Unlock()
	})
	return exit, err
}

// openStdio returns the three files the child gets, the writers for our
// ends of the output pipes (parallel to p.outputs), and the files this call
// opened that the parent must close once the child has started.
func (p *Process) openStdio(spec Spec) (stdio [3]*os.File, writers []io.Writer, opened []*os.File, err error) {
	switch in := spec.Stdin.(type) {
	case nil:
		stdio[0], err = devNull()
	case *os.File:
		stdio[0] = in
	default:
		stdio[0], p.stdin, err = os.Pipe()
		opened = append(opened, stdio[0])
	}
	if err != nil {
		return stdio, nil, opened, err
	}
	for i, w := range []io.Writer{spec.Stdout, spec.Stderr} {
		if i == 1 && w != nil && sameWriter(w, spec.Stdout) {
			stdio[2] = stdio[1]
			break
		}
		switch w := w.(type) {
		case nil:
			stdio[i+1], err = devNull()
		case *os.File:
			stdio[i+1] = w
		default:
			var r *os.File
			r, stdio[i+1], err = os.Pipe()
			if err == nil {
				opened = append(opened, stdio[i+1])
				p.outputs = append(p.outputs, r)
				writers = append(writers, w)
			}
		}
		if err != nil {
			return stdio, nil, opened, err
		}
	}
	return stdio, writers, opened, nil
}

// sameWriter reports whether a and b are the same writer; values whose
// type cannot be compared are not (as os/exec's interfaceEqual).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// devNull is /dev/null, opened once for reading and writing and never
// closed: every command without input, or whose output is discarded, gets
// a copy of it, with no path lookup per command.
var devNull = sync.OnceValues(func() (*os.File, error) {
	return os.OpenFile(os.DevNull, os.O_RDWR, 0)
})

// closeOurs closes the parent's pipe ends after a failed start.
func (p *Process) closeOurs() {
	if p.stdin != nil {
		p.stdin.Close()
	}
	closeAll(p.outputs)
}

// pump copies one output pipe to its writer until end of file.
func (p *Process) pump(r *os.File, w io.Writer) {
	defer p.pumps.Done()
	defer r.Close()
	buf := make([]byte, 32<<10)
	failed := false
	for {
		n, err := r.Read(buf)
		if n > 0 && !failed {
			if _, werr := w.Write(buf[:n]); werr != nil {
				failed = true
				p.errMu.Lock()
				if p.writeErr == nil {
					p.writeErr = werr
				}
				p.errMu.Unlock()
			}
		}
		if err != nil {
			return
		}
	}
}

// copyStdin feeds the command's standard input and then closes it, so the
// command sees end of input. A write error (the command has gone, or stopped
// reading and exited) ends the copy: the rest is of no use to anyone.
func copyStdin(w *os.File, r io.Reader) {
	io.Copy(w, r)
	w.Close()
}

// markerEnv, set to markerValue, tells a process started through
// /proc/self/exe to act as the shim. Commands never see it.
const (
	markerEnv   = "SANDBOXD_PROCTREE_SHIM"
	markerValue = "v1"
)

// withoutMarker drops markerEnv from env, so that a command that runs a
// binary linking this package does not make it a shim.
func withoutMarker(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, markerEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// exitOf turns a wait status into an Exit.
func exitOf(ws syscall.WaitStatus, killed bool, d time.Duration) Exit {
	if ws.Signaled() {
		return Exit{Code: -1, Signal: unix.SignalName(ws.Signal()), Killed: killed, Duration: d}
	}
	return Exit{Code: ws.ExitStatus(), Duration: d}
}

// notFoundError is the lookPath failure for a name in no PATH directory.
type notFoundError struct{}

func (notFoundError) Error() string        { return "executable file not found in $PATH" }
func (notFoundError) Is(target error) bool { return target == fs.ErrNotExist }

// defaultPath is searched when the environment has no PATH, as execvp does.
const defaultPath = "/usr/local/bin:/usr/bin:/bin"

// lookPath finds the program named name the way execvp would for a process
// with environment env running in dir: in the PATH of env, not of the caller.
// A name with a slash is returned as it is, for exec to resolve against dir,
// once it is seen to be an executable file.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, executable(name, dir)
	}
	search := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			search = v
		}
	}
	var denied bool
	for _, d := range filepath.SplitList(search) {
		if d == "" {
			d = "."
		}
		cand := d + "/" + name
		switch err := executable(cand, dir); {
		case err == nil:
			return cand, nil
		case errors.Is(err, fs.ErrPermission):
			denied = true
		}
	}
	if denied {
		return "", fs.ErrPermission
	}
	return "", notFoundError{}
}

// executable checks that name, relative to dir, is a file with an execute
// bit: ErrNotExist if it is not there, ErrPermission if it cannot be run.
func executable(name, dir string) error {
	if !filepath.IsAbs(name) && dir != "" {
		name = filepath.Join(dir, name)
	}
	fi, err := os.Stat(name)
	switch {
	case err != nil:
		return err
	case fi.IsDir() || fi.Mode()&0o111 == 0:
		return fs.ErrPermission
	}
	return nil
}

// execErrnos are the errors of execve and chdir that say the program (or the
// directory) is at fault, not the system.
var execErrnos = []syscall.Errno{
	syscall.ENOENT, syscall.ENOTDIR, syscall.EACCES, syscall.ENOEXEC,
	syscall.EISDIR, syscall.ETXTBSY, syscall.ELOOP, syscall.ENAMETOOLONG,
}

// startError classifies an error of starting argv0: an *fs.PathError with Op
// "exec" when the program is at fault, the error wrapped otherwise.
func startError(argv0 string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		for _, e := range execErrnos {
			if errno == e {
				return &fs.PathError{Op: "exec", Path: argv0, Err: errno}
			}
		}
	}
	return fmt.Errorf("proctree: starting %s: %w", argv0, err)
}
