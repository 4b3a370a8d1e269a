package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/mcpserver"
)

var cmdMCP = &command{
	name:    "mcp",
	args:    "[--backend memory|local|docker] [--workspace DIR] [--deliver auto|apply|patch|branch|none] [--patch FILE] [--config FILE] [--grant fs.write] [--grant shell.exec] [--always read,edit,shell] [--image IMAGE] [--egress PRESET|HOST:PORT] [--profile workspace-tools,workspace-shell] [--mode read|write] [--commands NAME,…|all] [--driver model|provider|custom] [--exec-timeout MS]",
	summary: "serve one session's workspace tools over MCP on standard input and output; the session ends when input closes, and its work is delivered",
	setup: func(fs *flag.FlagSet) runFunc {
		// MCP has no turns: a session has no call cap unless the operator
		// sets maxCallsPerRun, counted per _meta["sandboxd/runId"] when the
		// client sends one.
		f := sessionFlags{uncapped: true}
		f.register(fs)
		var d deliverFlags
		d.register(fs)
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			base, err := d.begin(ctx, &f)
			if err != nil {
				return err
			}
			if base != nil {
				defer base.Close()
			}
			s, err := f.openSession(ctx, sio)
			if err != nil {
				return err
			}
			defer s.close()
			err = serveMCP(ctx, sio, s)
			return errors.Join(err, d.deliver(ctx, sio, base, s))
		}
	},
}

// deliverFlags say what becomes of a copied workspace's work at the end.
type deliverFlags struct {
	mode  string
	patch string
}

func (d *deliverFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.mode, "deliver", "", "what becomes of the work of a copied workspace (memory, docker) at the end: "+
		"`how` — branch (a commit on sandboxd/SESSION in DIR's git repository; work tree and index untouched), "+
		"patch (a git-format patch file), apply (written into DIR, a file changed there meanwhile left alone as a conflict), "+
		"none (discarded), or auto (the default: branch when DIR is in a git work tree, else patch)")
	fs.StringVar(&d.patch, "patch", "", "the `file` a patch is written to (never replaced; default $XDG_STATE_HOME/sandboxd/deliveries/SESSION.patch)")
}

// begin reads the workspace directory before the session copies it: the
// baseline the work is measured against. It returns nil when there is
// nothing to deliver: the local backend works on the directory itself, and
// --deliver none discards the work.
func (d *deliverFlags) begin(ctx context.Context, f *sessionFlags) (*delivery.Baseline, error) {
	if f.backend == "local" {
		if d.mode != "" || d.patch != "" {
			return nil, usagef("--deliver and --patch apply to the memory and docker backends; local works on the directory itself")
		}
		return nil, nil
	}
	if d.mode == "" {
		d.mode = string(delivery.Auto)
	}
	mode, err := delivery.ParseMode(d.mode)
	if err != nil {
		return nil, usagef("--deliver: %v", err)
	}
	if mode == delivery.None {
		return nil, nil
	}
	if _, ok := backends[f.backend]; !ok {
		return nil, nil // openSession names the mistake
	}
	base, err := delivery.Begin(ctx, f.workspace)
	if err != nil {
		return nil, fmt.Errorf("reading the workspace before the copy: %w", err)
	}
	return base, nil
}

// deliver delivers the session's work as the flags say, and says on
// standard error what went where. It runs even when the session was
// interrupted, for a while: the work is not lost to a Ctrl-C.
func (d *deliverFlags) deliver(ctx context.Context, sio stdio, base *delivery.Baseline, s *session) error {
	if base == nil {
		if d.mode == string(delivery.None) {
			fmt.Fprintln(sio.err, "sandboxd: --deliver none: the session's work is discarded")
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	// Background commands are stopped first: what is delivered is not
	// being written meanwhile.
	if err := s.set.Close(ctx); err != nil {
		return fmt.Errorf("stopping the session's background commands: %w", err)
	}
	r, err := base.Deliver(ctx, s.fs, delivery.Request{Mode: delivery.Mode(d.mode), Session: s.id, PatchFile: d.patch})
	if r != nil {
		fmt.Fprint(sio.err, r)
	}
	if err != nil {
		return fmt.Errorf("delivering the session's work: %w", err)
	}
	return nil
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
