package workspace

import (
	"context"
	"fmt"
	"sync"
)

// TerminalBash is a Bash that can run a command on a pseudo-terminal: what
// an interactive program — a shell with job control and line editing, a
// pager, an editor — needs to behave as it does at a keyboard. It is an
// optional capability: callers check for it with a type assertion and say
// so when a Bash lacks it (see RunTerminal).
type TerminalBash interface {
	Bash
	// RunTerminal runs cmd as Run does — the same environment, working
	// directory, timeout, limits and process-tree kill — with a new
	// pseudo-terminal of t.Size as its controlling terminal and its
	// standard input, output and error, in a session of its own. A
	// terminal has one stream: Output gets everything the command writes,
	// as Stdout, terminal echo of the input included (cmd.Combined is
	// implied). cmd.Stdin is what is typed; its end leaves the terminal
	// open (a program reads end of input when ^D, "\x04", is typed). While
	// it runs, t.Resize (when not nil) is attached to the terminal: a size
	// it is given is applied before Resize returns, and the program gets
	// SIGWINCH as at a window's resize.
	RunTerminal(ctx context.Context, cmd Command, t Terminal) (Result, error)
}

// TermSize is a terminal's size in character cells.
type TermSize struct {
	Rows, Cols uint16
}

// Terminal is the pseudo-terminal a command runs on (TerminalBash).
type Terminal struct {
	// Size is its size at the start; both must be at least 1.
	Size TermSize
	// Resize, when not nil, changes its size while the command runs.
	Resize *Resizer
}

// A Resizer changes the size of a running command's terminal. Its caller
// may call Resize at any time, from any goroutine: before the terminal is
// open the size is kept, and applied when it opens (over Terminal.Size);
// while it is open, Resize applies it before it returns, so that input
// sent after Resize returns is read at the new size. The zero value is
// ready to use; one Resizer serves one command.
type Resizer struct {
	mu    sync.Mutex
	size  TermSize // the last size asked for, zero when none
	apply func(TermSize) error
	ended bool
}

// Resize sets the terminal's size; see Resizer. It fails with
// ErrInvalidArgument for a size with no cell, and with ErrNotFound once
// the command has ended.
func (r *Resizer) Resize(s TermSize) error {
	if err := s.Check(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return Errorf(ErrNotFound, "the command on the terminal has ended")
	}
	r.size = s
	if r.apply != nil {
		return r.apply(s)
	}
	return nil
}

// Attach is for a TerminalBash: apply sets the open terminal's size, from
// now until Detach; a size asked for before is applied now.
func (r *Resizer) Attach(apply func(TermSize) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apply = apply
	if r.size != (TermSize{}) {
		return apply(r.size)
	}
	return nil
}

// Opening is for a TerminalBash: the size a terminal whose start asks for
// size opens at — the last one asked of r before it opened, else size. A
// TerminalBash that opens the terminal elsewhere (across a connection)
// sends this one with its start, so that no program runs at the size of
// the start while a size asked for before is on its way.
func (r *Resizer) Opening(size TermSize) TermSize {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.size != (TermSize{}) {
		return r.size
	}
	return size
}

// Detach is for a TerminalBash: the command has ended, and Resize fails
// from now on.
func (r *Resizer) Detach() {
	r.mu.Lock()
	r.apply, r.ended = nil, true
	r.mu.Unlock()
}

// Check fails with ErrInvalidArgument for a size with no cell.
func (s TermSize) Check() error {
	if s.Rows == 0 || s.Cols == 0 {
		return Errorf(ErrInvalidArgument, "a terminal of %d rows and %d columns: want at least 1 of each", s.Rows, s.Cols)
	}
	return nil
}

// RunTerminal runs cmd on a terminal when b is a TerminalBash, and fails
// with ErrUnavailable, naming b's type, otherwise.
func RunTerminal(ctx context.Context, b Bash, cmd Command, t Terminal) (Result, error) {
	tb, ok := b.(TerminalBash)
	if !ok {
		return Result{}, &Error{Kind: ErrUnavailable, Msg: fmt.Sprintf("this workspace (%T) runs no command on a terminal", b)}
	}
	return tb.RunTerminal(ctx, cmd, t)
}
