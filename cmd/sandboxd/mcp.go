package main

import (
	"context"
	"errors"
	"flag"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcpserver"
)

var cmdMCP = &command{
	name:    "mcp",
	args:    "[--backend memory|local|docker] [--workspace DIR] [--config FILE] [--grant fs.write] [--grant shell.exec] [--always read,edit,shell] [--image IMAGE] [--profile workspace-tools,workspace-shell] [--mode read|write] [--commands NAME,…|all] [--driver model|provider|custom] [--exec-timeout MS]",
	summary: "serve one session's workspace tools over MCP on standard input and output; the session ends when input closes",
	setup: func(fs *flag.FlagSet) runFunc {
		return withSession(fs, serveMCP)
	},
}

// serveMCP serves the session over MCP on sio until the client closes its
// end or ctx ends.
func serveMCP(ctx context.Context, sio stdio, s *session) error {
	srv := mcpserver.New(s.set, mcpserver.WithImplementation("sandboxd", sandboxdVersion()))
	t := &mcpserver.LineTransport{
		Reader: sio.in,
		Writer: sio.out,
		// A write's content arrives in one line: let through a file of
		// maxFileBytes even with JSON escaping.
		MaxLineBytes: int(max(mcp.DefaultMaxLineLength, 2*s.set.Config().MaxFileBytes+1<<20)),
		LimitHint:    "the limit is the larger of 16 MiB and 2×maxFileBytes+1 MiB: raise maxFileBytes (--config FILE) for larger writes",
	}
	err := srv.Run(ctx, t)
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil // interrupted, or the client closed its end: the session is over
	}
	return err
}
