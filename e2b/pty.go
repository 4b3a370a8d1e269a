package e2b

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	pb "github.com/sandboxd/sandboxd/e2b/envdpb/process"
	"github.com/sandboxd/sandboxd/workspace"
)

// Processes with a terminal (envd's PTY): Start with pty runs the command
// on a pseudo-terminal of the sandbox's workspace (runner.Session's
// ExecTerminal: the docker backend's agent), its output one stream of pty
// data events, its input the pty input of SendInput and StreamInput, and
// Update resizes it before it answers, so input sent after the answer is
// read at the new size. Where the workspace has no terminal (the local,
// memory and kubernetes backends), Start with pty and Update answer
// unimplemented, in E2B's shape, as any feature this server lacks.

// maxTermCells bounds a terminal's rows and columns (a uint16 each in
// the kernel's winsize).
const maxTermCells = 1<<16 - 1

// terminalOf is the terminal a Start asks for; nil for none.
func terminalOf(b *sandbox, pty *pb.PTY) (*workspace.Terminal, error) {
	if pty == nil {
		return nil, nil
	}
	if !b.sess.Terminal() {
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("a process with a terminal (pty) on this sandbox's backend: %w", errNotSupported))
	}
	size, err := termSize(pty)
	if err != nil {
		return nil, err
	}
	return &workspace.Terminal{Size: size}, nil
}

// termSize is a PTY message's size, checked.
func termSize(pty *pb.PTY) (workspace.TermSize, error) {
	sz := pty.GetSize()
	if sz == nil || sz.Rows == 0 || sz.Cols == 0 || sz.Rows > maxTermCells || sz.Cols > maxTermCells {
		return workspace.TermSize{}, connect.NewError(connect.CodeInvalidArgument,
			fmt.Errorf("pty.size: %d rows and %d columns; want 1 to %d of each", sz.GetRows(), sz.GetCols(), maxTermCells))
	}
	return workspace.TermSize{Rows: uint16(sz.Rows), Cols: uint16(sz.Cols)}, nil
}

// Update resizes a process's terminal.
func (svc *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	b := boxOf(ctx)
	if req.Msg.Pty == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("update: want pty (its new size)"))
	}
	if !b.sess.Terminal() {
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("resizing a terminal (pty) on this sandbox's backend: %w", errNotSupported))
	}
	p, err := b.procs.find(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if p.resize == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal (start it with pty)", p.pid))
	}
	size, err := termSize(req.Msg.Pty)
	if err != nil {
		return nil, err
	}
	if err := p.resize.Resize(size); err != nil {
		if errors.Is(err, workspace.ErrNotFound) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
		}
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
