package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// dialTimeout bounds the agent's connect to a loopback port: on loopback a
// connect is answered at once, so only a full listen backlog takes long.
const dialTimeout = 10 * time.Second

// Dial connects, in the agent's world, to addr — a loopback address and
// port such as "127.0.0.1:8000", where a program in the workspace listens
// — and returns that connection: what is written to it the program reads,
// and what the program writes is read from it, under the same window
// credit, CloseWrite and Close as a connection of Accept (a *Conn). It is
// the way in to a server in a workspace that has no network of its own,
// as Accept is the way out.
//
// Dial fails with workspace.ErrNotFound when nothing listens on addr (the
// connection was refused), workspace.ErrTimeout when the connect takes
// longer than the agent waits, workspace.ErrInvalidArgument for an address
// that is not loopback, ctx's error when ctx ends first, and
// workspace.ErrUnavailable once the stream is broken (or an agent too old
// to dial answers it as an unknown operation, ErrInvalidArgument).
func (c *Client) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return c.open(ctx, opDial, addr)
}

// dial serves a Dial call: it connects to the loopback address asked for,
// then carries the connection as accept does.
func (c *serverConn) dial(call *serverCall) error {
	addr := call.req.Addr
	if err := loopbackAddr(opDial, addr); err != nil {
		return err
	}
	d := net.Dialer{Timeout: dialTimeout}
	conn, err := d.DialContext(call.ctx, "tcp", addr)
	switch {
	case err == nil:
	case call.ctx.Err() != nil:
		return call.ctx.Err()
	case errors.Is(err, syscall.ECONNREFUSED):
		return &RemoteError{Kind: workspace.ErrNotFound, Msg: fmt.Sprintf("dial %s: connection refused: nothing listens on that port in the workspace", addr)}
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return &RemoteError{Kind: workspace.ErrTimeout, Msg: fmt.Sprintf("dial %s: no answer in %v", addr, dialTimeout)}
	default:
		return &RemoteError{Kind: workspace.ErrUnavailable, Msg: "dial " + addr + ": " + err.Error()}
	}
	return c.carry(call, conn, conn.LocalAddr().String())
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
