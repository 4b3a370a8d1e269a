package agent

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/sandboxd/sandboxd/workspace"
)

// Commands on a pseudo-terminal (workspace.TerminalBash). A pty call is a
// run call whose request also carries the terminal's size (ptyRequest):
// its input, output (one stream), flow control, timeout and cancellation
// are a run's, and the agent runs it with its Bash's RunTerminal — in the
// container, localexec's: the same limits and process-tree kill as every
// command. A resize is a Data frame of the call flagged flagResize, whose
// payload is the new size (ptySize); it is applied before the agent reads
// the frames after it, so input sent after a resize is read at the new
// size. An agent that runs no command on a terminal says so in its Hello
// (hello.Terminal unset), and RunTerminal fails at once.

// ptyRequest is a pty call's terminal.
type ptyRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

var _ workspace.TerminalBash = (*Client)(nil)

// RunTerminal runs a command on a pseudo-terminal in the agent; see
// workspace.TerminalBash and Run, whose guarantees it shares. It fails
// with workspace.ErrUnavailable when the agent runs no command on a
// terminal (its build predates them, or its Bash has none).
func (c *Client) RunTerminal(ctx context.Context, cmd workspace.Command, t workspace.Terminal) (workspace.Result, error) {
	if err := t.Size.Check(); err != nil {
		return workspace.Result{}, err
	}
	if !c.info.Terminal {
		return workspace.Result{}, workspace.Errorf(workspace.ErrUnavailable, "the agent runs no command on a terminal (build %s)", c.info.Build)
	}
	return c.run(ctx, cmd, &t)
}

// ptySize encodes a terminal size as a resize frame's payload: rows and
// columns, big-endian.
func ptySize(s workspace.TermSize) []byte {
	var p [4]byte
	binary.BigEndian.PutUint16(p[:2], s.Rows)
	binary.BigEndian.PutUint16(p[2:], s.Cols)
	return p[:]
}

// attachResize makes r send call's resizes, until r is detached.
func (c *Client) attachResize(call *call, r *workspace.Resizer) {
	r.Attach(func(s workspace.TermSize) error {
		return c.send(frameData, flagResize, call.id, nil, ptySize(s))
	})
}

// isTerminal reports whether b runs commands on a terminal.
func isTerminal(b workspace.Bash) bool {
	_, ok := b.(workspace.TerminalBash)
	return ok
}

// runTerminal serves a pty call.
func (c *serverConn) runTerminal(call *serverCall) ([]byte, error) {
	tb, ok := c.s.bash.(workspace.TerminalBash)
	if !ok {
		return nil, &RemoteError{Kind: workspace.ErrUnavailable, Msg: "this agent runs no command on a terminal"}
	}
	size := workspace.TermSize{Rows: call.req.Pty.Rows, Cols: call.req.Pty.Cols}
	res, err := tb.RunTerminal(call.ctx, c.command(call), workspace.Terminal{Size: size, Resize: call.resize})
	return encodeResult(res), err
}

// resized applies a resize frame to its call, in the read loop: before
// the input that follows it. One for a call that has ended is dropped; a
// malformed one, or one for a call that is no pty call, breaks the
// protocol.
func (c *serverConn) resized(call *serverCall, f frame) error {
	switch {
	case call == nil:
		return nil
	case call.resize == nil || len(f.payload) != 4:
		return fmt.Errorf("%w: a resize of %d bytes for a %s call", errFrame, len(f.payload), call.req.Op)
	}
	s := workspace.TermSize{Rows: binary.BigEndian.Uint16(f.payload[:2]), Cols: binary.BigEndian.Uint16(f.payload[2:])}
	if err := call.resize.Resize(s); err != nil {
		c.s.opts.log.Debug("agent: resize not applied", "id", f.id, "err", err)
	}
	return nil
}
