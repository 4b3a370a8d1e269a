package runner

import (
	"context"

	"github.com/sandboxd/sandboxd/workspace"
)

// Terminal reports whether the session's workspace runs commands on a
// pseudo-terminal (its Bash is a workspace.TerminalBash: the docker
// backend's agent). Where it does not, ExecTerminal fails.
func (s *Session) Terminal() bool {
	_, ok := s.inst.Bash.(workspace.TerminalBash)
	return ok
}

// ExecTerminal is Exec on a pseudo-terminal (workspace.TerminalBash): the
// same grant, environment, slot of calls, audit and cancellation, with
// the command's output one stream. It fails with ErrUnavailable where the
// workspace has no terminal (Terminal is false).
func (s *Session) ExecTerminal(ctx context.Context, op string, cmd workspace.Command, t workspace.Terminal) (workspace.Result, error) {
	return s.exec(ctx, op, cmd, func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		return workspace.RunTerminal(ctx, s.inst.Bash, cmd, t)
	})
}
