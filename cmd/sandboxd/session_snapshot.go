package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
)

var cmdSessionSnapshot = &command{
	name:    "session snapshot",
	args:    "[--json] ID",
	summary: "save a session's workspace tree as a snapshot on a running daemon and print its ID",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		asJSON := fs.Bool("json", false, "print the snapshot as JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) != 1 {
				return usagef("name one session")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			res, err := cl.SnapshotCreate(ctx, args[0], client.SnapshotCreateOptions{})
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(sio.out, res.Snapshot)
			}
			fmt.Fprintln(sio.out, res.Snapshot.ID)
			return nil
		}
	},
}

var cmdSessionFork = &command{
	name:    "session fork",
	args:    "[--count N] [--settings JSON] [--json] ID",
	summary: "fork a session on a running daemon into N sessions with its tree and settings; print their IDs",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		count := fs.Int("count", 1, "how many sessions")
		settings := fs.String("settings", "", "a JSON object of `settings` that replace the source's, key by key")
		asJSON := fs.Bool("json", false, "print the sessions as JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) != 1 {
				return usagef("name one session")
			}
			var over json.RawMessage
			if *settings != "" {
				if !json.Valid([]byte(*settings)) {
					return usagef("--settings is not JSON")
				}
				over = json.RawMessage(*settings)
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			res, err := cl.SessionFork(ctx, args[0], client.SessionForkOptions{Count: *count, Settings: over})
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(sio.out, res.Sessions)
			}
			for _, s := range res.Sessions {
				fmt.Fprintln(sio.out, s.ID)
			}
			return nil
		}
	},
}

var cmdSessionPause = sessionStateCommand("session pause",
	"pause a session on a running daemon: its container stops, its files are kept (resume it with session resume)",
	func(ctx context.Context, cl *client.Client, id string) (runner.Info, error) {
		res, err := cl.SessionPause(ctx, id, client.SessionPauseOptions{})
		return res.Session, err
	})

var cmdSessionResume = sessionStateCommand("session resume",
	"resume a paused session on a running daemon: the same ID, settings and files",
	func(ctx context.Context, cl *client.Client, id string) (runner.Info, error) {
		res, err := cl.SessionResume(ctx, id, client.SessionResumeOptions{})
		return res.Session, err
	})

// sessionStateCommand is a command that changes one session's state with
// do and prints the session's ID and state (or, with --json, the session).
func sessionStateCommand(name, summary string, do func(context.Context, *client.Client, string) (runner.Info, error)) *command {
	return &command{
		name: name, args: "[--json] ID", summary: summary,
		setup: func(fs *flag.FlagSet) runFunc {
			c := daemonFlags(fs)
			asJSON := fs.Bool("json", false, "print the session as JSON")
			return func(ctx context.Context, sio stdio, args []string) error {
				if len(args) != 1 {
					return usagef("name one session")
				}
				cl, err := c.open()
				if err != nil {
					return err
				}
				in, err := do(ctx, cl, args[0])
				if err != nil {
					return err
				}
				if *asJSON {
					return printJSON(sio.out, in)
				}
				fmt.Fprintln(sio.out, in.ID, in.State)
				return nil
			}
		},
	}
}

var cmdSnapshotList = &command{
	name:    "snapshot ls",
	args:    "[--templates] [--json]",
	summary: "list the tenant's snapshots (or the daemon's templates) on a running daemon",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		templates := fs.Bool("templates", false, "list the operator's templates instead")
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			if *templates {
				list, err := cl.TemplateList(ctx, client.TemplateListOptions{})
				if err != nil {
					return err
				}
				if *asJSON {
					return printJSON(sio.out, list)
				}
				printSnapshots(sio.out, list.Templates)
				return nil
			}
			list, err := cl.SnapshotList(ctx, client.SnapshotListOptions{})
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(sio.out, list)
			}
			printSnapshots(sio.out, list.Snapshots)
			fmt.Fprintf(sio.out, "%d snapshots holding %d bytes; caps: %s snapshots, %s bytes\n", list.Usage.Count, list.Usage.StoredBytes,
				orNone(int64(list.Limits.Count)), orNone(list.Limits.Bytes))
			return nil
		}
	},
}

func orNone(n int64) string {
	if n == 0 {
		return "no cap of"
	}
	return fmt.Sprint(n)
}

// printSnapshots writes snapshots as a table; times are local.
func printSnapshots(w io.Writer, list []snapshot.Info) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tFILES\tBYTES\tSTORED\tFROM SESSION\tMANIFEST")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.ID, s.Created.Local().Format(time.DateTime), s.Files, s.Bytes, s.StoredBytes, s.Session, s.Manifest)
	}
	tw.Flush()
}

var cmdSnapshotRemove = &command{
	name:    "snapshot rm",
	args:    "ID...",
	summary: "delete snapshots on a running daemon (sessions started from them keep their files)",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) == 0 {
				return usagef("name at least one snapshot")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			return eachID(args, func(id string) error {
				_, err := cl.SnapshotRemove(ctx, id, client.SnapshotRemoveOptions{})
				return err
			})
		}
	},
}
