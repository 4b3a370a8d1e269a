package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/scope"
)

// daemonClient is the client of a running daemon the session commands
// use: --url and --token, or SANDBOXD_URL and SANDBOXD_TOKEN.
type daemonClient struct {
	url, token string
}

// daemonFlags declares --url and --token on fs.
func daemonFlags(fs *flag.FlagSet) *daemonClient {
	c := &daemonClient{}
	fs.StringVar(&c.url, "url", "", "the daemon's `URL` (default $SANDBOXD_URL, else http://"+defaultListen+")")
	fs.StringVar(&c.token, "token", "", "the tenant's bearer `token` (default $SANDBOXD_TOKEN)")
	return c
}

// open returns the client the flags and the environment describe.
func (c *daemonClient) open() (*client.Client, error) {
	if c.token == "" && os.Getenv("SANDBOXD_TOKEN") == "" {
		return nil, errors.New("no token: set SANDBOXD_TOKEN (sandboxd serve prints one in development) or pass --token")
	}
	opts := []client.Opt{client.WithBaseURL("http://" + defaultListen), client.FromEnv}
	if c.url != "" {
		opts = append(opts, client.WithBaseURL(c.url))
	}
	if c.token != "" {
		opts = append(opts, client.WithToken(c.token))
	}
	return client.New(opts...)
}

// globsFlag collects one glob per use: globs may hold commas ("{a,b}").
type globsFlag []string

func (g *globsFlag) String() string { return strings.Join(*g, " ") }

func (g *globsFlag) Set(s string) error {
	*g = append(*g, s)
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

var cmdSessionCreate = &command{
	name:    "session create",
	args:    "[--grant fs.write] [--grant shell.exec] [--always read,edit,shell] [--visible GLOB]... [--commit GLOB]... [--image IMAGE] [--snapshot ID | --template NAME] [--egress PRESET|HOST:PORT]... [--secret NAME]... [--lifetime D] [--idle-timeout D] [--json]",
	summary: "create a session on a running daemon and print its ID",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		var grants, always, egress, secrets listFlag
		fs.Var(&grants, "grant", "a `permission` to give: fs.write or shell.exec; repeatable")
		fs.Var(&egress, "egress", "a `rule` of what the session's commands may reach, within the daemon's egress.allow: a preset or HOST:PORT; repeatable (default: the daemon's; \"\" for none)")
		fs.Var(&always, "always", "`skills` active from the first step: read, edit, shell")
		fs.Var(&secrets, "secret", "a `name` of the daemon's secrets the session's commands get a placeholder for; repeatable (default: all its tenant may have; \"\" for none)")
		image := fs.String("image", "", "the container `image` (default: the daemon's)")
		snap := fs.String("snapshot", "", "a snapshot `ID` whose tree the workspace starts with (sandboxd snapshot ls)")
		template := fs.String("template", "", "a template `name` whose tree the workspace starts with (sandboxd snapshot ls --templates)")
		lifetime := fs.Duration("lifetime", 0, "end the session after this `duration` (default: the daemon's)")
		idle := fs.Duration("idle-timeout", 0, "end the session after this long without calls (default: the daemon's)")
		var visible, commit globsFlag
		fs.Var(&visible, "visible", "a `glob` of what the agent may see (actor scope); repeatable")
		fs.Var(&commit, "commit", "a `glob` of what the agent may change (actor scope); repeatable")
		asJSON := fs.Bool("json", false, "print the session as JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			st := runner.Settings{Image: *image, Snapshot: *snap, Template: *template, Grants: grants.values, Lifetime: runner.Duration(*lifetime), IdleTimeout: runner.Duration(*idle),
				Scope: scope.Rules{Visible: visible, Commit: commit}}
			if always.set {
				st.Always = always.values
			}
			if egress.set {
				st.Egress = append([]string{}, egress.values...)
			}
			if secrets.set {
				st.Secrets = append([]string{}, secrets.values...)
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			res, err := cl.SessionCreate(ctx, client.SessionCreateOptions{Settings: st})
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(sio.out, res.Session)
			}
			fmt.Fprintln(sio.out, res.Session.ID)
			return nil
		}
	},
}

var cmdSessionEgress = &command{
	name:    "session egress",
	args:    "[--none | --reset] [--json] ID [PRESET|HOST:PORT]...",
	summary: "show a session's egress, or change it while it runs (open connections no longer allowed are cut)",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		none := fs.Bool("none", false, "allow nothing from now on")
		reset := fs.Bool("reset", false, "go back to the tenant's egress (the daemon's egress.allow, as the tenant's narrows it)")
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) == 0 {
				return usagef("name a session")
			}
			id, rules := args[0], args[1:]
			if *none && *reset || (*none || *reset) && len(rules) > 0 {
				return usagef("give rules, --none or --reset, one of them")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			var p runner.EgressPolicy
			if len(rules) == 0 && !*none && !*reset {
				res, err := cl.SessionEgress(ctx, id, client.SessionEgressOptions{})
				if err != nil {
					return err
				}
				p = res.Egress
			} else {
				res, err := cl.SessionEgressSet(ctx, id, client.SessionEgressSetOptions{Allow: rules, Reset: *reset})
				if err != nil {
					return err
				}
				p = res.Egress
			}
			if *asJSON {
				return printJSON(sio.out, p)
			}
			allow := "nothing"
			if len(p.Allow) > 0 {
				allow = strings.Join(p.Allow, " ")
			}
			fmt.Fprintf(sio.out, "allow:   %s\n", allow)
			if len(p.Secrets) > 0 {
				fmt.Fprintf(sio.out, "secrets: %s\n", strings.Join(p.Secrets, " "))
			}
			return nil
		}
	},
}

var cmdSessionList = &command{
	name:    "session ls",
	args:    "[--json]",
	summary: "list the tenant's sessions on a running daemon",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			list, err := cl.SessionList(ctx, client.SessionListOptions{})
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(sio.out, list)
			}
			printSessions(sio.out, list.Sessions)
			return nil
		}
	},
}

// printSessions writes sessions as a table whose headings say what each
// column holds; times are local.
func printSessions(w io.Writer, sessions []runner.Info) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tBACKEND\tCREATED\tLAST ACTIVE\tCALLS RUNNING\tENDS AT (LIFETIME)\tENDS IF IDLE FOR\tWORKSPACE (CONTAINER OR DIRECTORY)")
	for _, s := range sessions {
		ends, idle := "never", "never"
		if s.ExpiresAt != nil {
			ends = s.ExpiresAt.Local().Format(time.DateTime)
		}
		if s.IdleTimeout > 0 {
			idle = time.Duration(s.IdleTimeout).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.ID, s.Backend, s.Created.Local().Format(time.DateTime),
			s.LastUsed.Local().Format(time.DateTime), s.CallsInFlight, ends, idle, s.Workspace)
	}
	tw.Flush()
}

var cmdSessionRemove = &command{
	name:    "session rm",
	args:    "--all | ID...",
	summary: "end sessions on a running daemon (calls in flight are cancelled, workspaces removed)",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		all := fs.Bool("all", false, "end every session of the tenant, those the daemon took back from its earlier runs too")
		return func(ctx context.Context, sio stdio, args []string) error {
			switch {
			case *all && len(args) > 0:
				return usagef("--all or session IDs, not both")
			case !*all && len(args) == 0:
				return usagef("name at least one session, or --all")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			if *all {
				list, err := cl.SessionList(ctx, client.SessionListOptions{})
				if err != nil {
					return err
				}
				for _, s := range list.Sessions {
					args = append(args, s.ID)
				}
			}
			return eachID(args, func(id string) error {
				_, err := cl.SessionRemove(ctx, id, client.SessionRemoveOptions{})
				return err
			})
		}
	},
}

// eachID calls fn for every ID, and returns the failures, each named by its
// ID.
func eachID(ids []string, fn func(id string) error) error {
	var errs []error
	for _, id := range ids {
		if err := fn(id); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

var cmdSessionCall = &command{
	name:    "session call",
	args:    "[--json] ID TOOL [ARGUMENTS-JSON]",
	summary: "call a tool of a session on a running daemon; bash output is shown as it arrives",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		asJSON := fs.Bool("json", false, "print the whole result as JSON (content, structuredContent, isError)")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) < 2 || len(args) > 3 {
				return usagef("want a session ID, a tool and optionally its arguments as JSON")
			}
			args3 := json.RawMessage("{}")
			if len(args) == 3 {
				args3 = json.RawMessage(args[2])
				if !json.Valid(args3) {
					return usagef("the arguments are not JSON: %s", args[2])
				}
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			// Output is shown as it comes, unless the whole result is
			// printed as JSON.
			live := &shownWriter{w: sio.out}
			opts := client.ToolCallOptions{Tool: args[1], Arguments: args3, Output: live}
			if *asJSON {
				opts.Output = io.Discard
			}
			res, err := cl.ToolCall(ctx, args[0], opts)
			if err != nil {
				return err
			}
			result := res.CallResult
			if *asJSON {
				err = printJSON(sio.out, result)
			} else if len(result.Content) > 0 {
				text := result.Content[0].Text
				if shown := live.shown.String(); shown != "" {
					// The output has been shown as it came; print what follows it.
					text = strings.TrimPrefix(strings.TrimPrefix(text, shown), "\n")
				}
				fmt.Fprint(sio.out, text)
				if !strings.HasSuffix(text, "\n") {
					fmt.Fprintln(sio.out)
				}
			}
			if err != nil {
				return err
			}
			if result.IsError {
				return errors.New("the tool reported a failure")
			}
			if code := commandStatus(result); code != 0 {
				return &exitStatus{code: code} // the command has said why
			}
			return nil
		}
	},
}

// commandStatus is the exit status a call that ran a command (bash,
// workspace_exec) passes on, as a shell would give it: the command's own
// non-zero status, 128 plus the number of the signal that killed it, or 124
// when it timed out (as timeout(1) does); 0 for anything else.
func commandStatus(r httpapi.CallResult) int {
	var run struct {
		ExitCode *int   `json:"exitCode"`
		Signal   string `json:"signal"`
		TimedOut bool   `json:"timedOut"`
	}
	data, err := json.Marshal(r.StructuredContent)
	if err != nil || json.Unmarshal(data, &run) != nil || run.ExitCode == nil {
		return 0
	}
	switch {
	case run.TimedOut:
		return 124
	case run.Signal != "":
		if n := unix.SignalNum(run.Signal); n != 0 {
			return 128 + int(n)
		}
		return 1
	case *run.ExitCode < 0 || *run.ExitCode > 255:
		return 1
	}
	return *run.ExitCode
}

// shownWriter passes output on and keeps what it showed.
type shownWriter struct {
	w     io.Writer
	shown strings.Builder
}

func (s *shownWriter) Write(p []byte) (int, error) {
	s.shown.Write(p)
	return s.w.Write(p)
}
