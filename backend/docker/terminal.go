package docker

import (
	"context"

	"github.com/sandboxd/sandboxd/workspace"
)

// A session container's agent runs commands on a pseudo-terminal, in the
// container, under the same hardening, limits and process-tree kill as
// every command (agent.Client.RunTerminal).
var _ workspace.TerminalBash = (*Bash)(nil)

// RunTerminal runs cmd on a pseudo-terminal in the container; see
// workspace.TerminalBash and Run. It fails with workspace.ErrUnavailable
// when the container's agent predates terminals.
func (b *Bash) RunTerminal(ctx context.Context, cmd workspace.Command, t workspace.Terminal) (workspace.Result, error) {
	if err := t.Size.Check(); err != nil {
		return workspace.Result{}, err
	}
	b.makeHome(ctx, cmd.Timeout)
	return b.c.agent.RunTerminal(ctx, cmd, t)
}
