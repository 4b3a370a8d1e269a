package runner

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/sandboxd/sandboxd/workspace"
)

// CanDial reports whether the session's workspace can be dialled into
// (backend.Instance.Dial: docker and kubernetes, whose agent connects to
// the workspace's loopback). Where it cannot, Dial fails.
func (s *Session) CanDial() bool { return s.inst.Dial != nil }

// Dial connects to port on the workspace's loopback, where a program of
// the session listens, and returns the connection (backend.Instance.Dial):
// the way in to a server a command started, for a translation of another
// sandbox API's ports (package e2b). The connection is carried by the
// workspace's agent, so the workspace keeps no network of its own; it
// ends when the session does. It holds no slot of the session's calls: a
// connection may live as long as the session. It fails with ErrClosed
// once the session has ended, workspace.ErrUnavailable where the
// workspace cannot be dialled (CanDial), workspace.ErrNotFound when
// nothing listens on port, and workspace.ErrInvalidArgument for a port
// out of range.
func (s *Session) Dial(ctx context.Context, port int) (net.Conn, error) {
	if err := s.ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrClosed, s.id)
	}
	if s.inst.Dial == nil {
		return nil, &workspace.Error{Kind: workspace.ErrUnavailable, Msg: "this session's workspace cannot be dialled (its backend has no agent that carries connections in)"}
	}
	if port < 1 || port > 65535 {
		return nil, &workspace.Error{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("port %d: want 1 to 65535", port)}
	}
	return s.inst.Dial(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}
