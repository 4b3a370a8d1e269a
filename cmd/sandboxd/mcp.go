package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/mcpserver"
)

var cmdMCP = &command{
	name:    "mcp",
	args:    "[--backend " + backendChoices(sessionable) + "] [--build-missing] [--workspace DIR] [--deliver auto|apply|patch|branch|none] [--patch FILE] [--config FILE] [--grant fs.write] [--grant shell.exec] [--always read,edit,shell] [--image IMAGE] [--egress PRESET|HOST:PORT] [--ca-cert FILE] [--profile workspace-tools,workspace-shell] [--mode read|write] [--commands NAME,…|all] [--driver model|provider|custom] [--exec-timeout MS] [--resume SESSION] [--list]",
	summary: "serve one session's workspace tools over MCP on standard input and output; the session ends when input closes, and its work is delivered",
	setup: func(fs *flag.FlagSet) runFunc {
		// MCP has no turns: a session has no call cap unless the operator
		// sets maxCallsPerRun, counted per _meta["sandboxd/runId"] when the
		// client sends one.
		f := sessionFlags{uncapped: true, defaultBackend: "docker"}
		f.register(fs)
		var d deliverFlags
		d.register(fs)
		resume := fs.String("resume", "", "continue the `session` a killed run for the workspace left (its files, journal, diff, skills and background commands) rather than start a new one, and deliver its work at the end; 'sandboxd mcp --list' lists them")
		list := fs.Bool("list", false, "list the sessions of runs on this host (serving, left by a killed run, delivered lately) and what a next run does with each, and exit")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			if *list {
				return listRuns(sio)
			}
			run, base, err := d.begin(ctx, sio, &f, *resume)
			if err != nil {
				return err
			}
			s, err := f.openSession(ctx, sio)
			if err != nil {
				if run != nil && *resume != "" {
					run.release() // its record left for another run, once this one has exited
				} else if run != nil {
					run.discard()
				}
				return err
			}
			if run != nil {
				run.rec.Session = s.id
				if err := run.save(); err != nil {
					s.close()
					run.discard()
					return fmt.Errorf("keeping the record of the session's run: %w", err)
				}
				sayResumable(sio, run, s, *resume != "")
			}
			err = serveMCP(ctx, sio, s)
			return errors.Join(err, d.end(ctx, sio, run, base, s))
		}
	},
}

// sayResumable says on standard error which session the run serves, and
// how to continue it should the run be killed; for a resumed one, what it
// did not get back.
func sayResumable(sio stdio, run *mcpRun, s *session, resumed bool) {
	if run.rec.Backend != "docker" {
		return
	}
	if resumed {
		fmt.Fprintf(sio.err, "sandboxd: session %s of %s resumed: its files, journal, diff and background commands are as the killed run left them\n", s.id, run.rec.Workspace)
		for _, l := range s.lost {
			fmt.Fprintf(sio.err, "sandboxd: session %s did not get back %s\n", s.id, l)
		}
	}
	fmt.Fprintf(sio.err, "sandboxd: session %s of %s; should this run be killed, 'sandboxd mcp --resume %s' continues it (a plain 'sandboxd mcp' delivers its work)\n", s.id, run.rec.Workspace, s.id)
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
// baseline the work is measured against, kept with the run's record
// (mcpRun) so that a killed run's work is delivered by the next. Before
// that it settles what ended runs left (settle): a killed run's work on
// this workspace is delivered first, as it would have been, so the new
// copy starts from it. With resume, it takes over the run that left that
// session instead (resumeRun). It returns nils when there is nothing to
// deliver: the local backend works on the directory itself, and --deliver
// none discards the work.
func (d *deliverFlags) begin(ctx context.Context, sio stdio, f *sessionFlags, resume string) (*mcpRun, *delivery.Baseline, error) {
	if resume != "" {
		return d.resumeRun(ctx, sio, f, resume)
	}
	entry, unknown := backendNamed(f.backend, sessionable)
	if unknown == nil && entry.inPlace {
		if d.mode != "" || d.patch != "" {
			return nil, nil, usagef("--deliver and --patch apply to the %s backends; %s works on the directory itself",
				andList(backendNames(sessionable, copied)), f.backend)
		}
		return nil, nil, nil
	}
	if d.mode == "" {
		d.mode = string(delivery.Auto)
	}
	mode, err := delivery.ParseMode(d.mode)
	if err != nil {
		return nil, nil, usagef("--deliver: %v", err)
	}
	if unknown != nil {
		return nil, nil, nil // openSession names an unknown backend
	}
	d.settle(ctx, sio, f)
	if mode == delivery.None {
		return nil, nil, nil
	}
	abs, err := filepath.Abs(f.workspace)
	if err != nil {
		return nil, nil, err
	}
	patch := d.patch
	if patch != "" {
		if patch, err = filepath.Abs(patch); err != nil {
			return nil, nil, err
		}
	}
	rec := runRecord{Workspace: abs, Backend: entry.name, Deliver: d.mode, Patch: patch}
	if entry.name == "docker" {
		rec.Daemon = newDaemonName()
	}
	run, err := newRun(rec)
	if err != nil {
		return nil, nil, fmt.Errorf("keeping the record of the session's run: %w", err)
	}
	base, err := run.begin(ctx, f.workspace)
	if err != nil {
		run.discard()
		return nil, nil, fmt.Errorf("reading the workspace before the copy: %w", err)
	}
	f.labels = map[string]string{labelMCPRun: run.dir}
	if rec.Daemon != "" {
		// The session's record, journal and first tree are kept in the
		// run's directory, for a run that resumes it.
		f.daemon, f.stateDir = rec.Daemon, run.dir
	}
	return run, base, nil
}

// settle removes what killed runs left in the temporary directory and
// settles what ended runs left (settleRuns) before this run's session
// starts.
func (d *deliverFlags) settle(ctx context.Context, sio stdio, f *sessionFlags) {
	if n, size, err := delivery.RemoveStale(); err != nil {
		fmt.Fprintf(sio.err, "sandboxd: removing what killed runs left in the temporary directory: %v\n", err)
	} else if n > 0 {
		fmt.Fprintf(sio.err, "sandboxd: removed %d copies (%d bytes) that killed runs left in the temporary directory\n", n, size)
	}
	var cli client.APIClient
	if entry, err := backendNamed(f.backend, sessionable); err == nil && entry.container {
		if c, err := dockerClient(ctx); err == nil { // else openSession says why
			defer c.Close()
			cli = c
		}
	}
	settleRuns(ctx, sio, cli, f.workspace)
}

// end delivers the session's work (deliver) and ends the session. Once the
// work is delivered the run's record goes, and the session's container
// with it. A delivery that failed after it was journaled is finished by
// the next run from what the record keeps; one that failed before leaves
// the container too (its work is in it), for the next run to deliver.
func (d *deliverFlags) end(ctx context.Context, sio stdio, run *mcpRun, base *delivery.Baseline, s *session) error {
	rep, err := d.deliver(ctx, sio, base, s)
	switch {
	case run == nil:
		return errors.Join(err, s.close())
	case err == nil:
		rememberDelivered(sio, run.rec.Session, run.rec.Workspace, rep)
		run.rec.Delivered = true
		if serr := run.save(); serr != nil {
			fmt.Fprintf(sio.err, "sandboxd: %v\n", serr)
		}
		return errors.Join(s.close(), run.discard())
	case base.Interrupted() || run.rec.Backend != "docker":
		fmt.Fprintf(sio.err, "sandboxd: the delivery is kept in %s: the next 'sandboxd mcp' finishes it (or says why it cannot)\n", run.dir)
		err = errors.Join(err, s.close())
		run.release()
		return err
	default:
		// The process exits without closing the session: its container
		// stays, with the work.
		fmt.Fprintf(sio.err, "sandboxd: the session's container keeps its work: the next 'sandboxd mcp --backend docker --workspace %s' delivers it, or 'sandboxd mcp --workspace %s --resume %s' continues the session\n", run.rec.Workspace, run.rec.Workspace, run.rec.Session)
		run.release()
		return err
	}
}

// deliver delivers the session's work as the flags say, and says on
// standard error what went where. It runs even when the session was
// interrupted, for a while: the work is not lost to a Ctrl-C.
func (d *deliverFlags) deliver(ctx context.Context, sio stdio, base *delivery.Baseline, s *session) (*delivery.Report, error) {
	if base == nil {
		if d.mode == string(delivery.None) {
			fmt.Fprintln(sio.err, "sandboxd: --deliver none: the session's work is discarded")
		}
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	// Background commands are stopped first: what is delivered is not
	// being written meanwhile.
	if err := s.set.Close(ctx); err != nil {
		return nil, fmt.Errorf("stopping the session's background commands: %w", err)
	}
	r, err := base.Deliver(ctx, s.fs, delivery.Request{Mode: delivery.Mode(d.mode), Session: s.id, PatchFile: d.patch})
	if r != nil {
		fmt.Fprint(sio.err, r)
	}
	if err != nil {
		return r, fmt.Errorf("delivering the session's work: %w", err)
	}
	return r, nil
}

// serveMCP serves the session over MCP on sio until the client closes its
// end or ctx ends.
func serveMCP(ctx context.Context, sio stdio, s *session) error {
	raiseHeapFloor()
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

// heapFloor is raiseHeapFloor's ballast: never read or written, so the
// kernel gives it no pages, but counted as live by the collector.
var heapFloor []byte

// raiseHeapFloor makes the collector run every 16 MiB or more of
// allocation rather than every 4–5 MiB: a session's live heap is small, and
// each call allocates its JSON several times over (the SDK marshals a 4 KB
// read's result three times), so at the default the collector took a third
// of sandboxd mcp's CPU on small reads. The heap so grows by at most 16 MiB
// more than it would; GOGC, when set, is left to rule alone.
func raiseHeapFloor() {
	if _, set := os.LookupEnv("GOGC"); !set && heapFloor == nil {
		heapFloor = make([]byte, 16<<20)
	}
}
