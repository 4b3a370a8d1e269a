package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/scope"
)

// daemonClient talks to a running daemon: --url and --token, or
// SANDBOXD_URL and SANDBOXD_TOKEN.
type daemonClient struct {
	url, token string
}

func (c *daemonClient) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", "", "the daemon's `URL` (default $SANDBOXD_URL, else http://"+defaultListen+")")
	fs.StringVar(&c.token, "token", "", "the tenant's bearer `token` (default $SANDBOXD_TOKEN)")
}

// do sends a request and decodes a JSON answer into out; an error answer
// becomes an error carrying the daemon's message.
func (c *daemonClient) do(ctx context.Context, method, path string, in, out any, header ...string) (*http.Response, error) {
	base := strings.TrimSuffix(cmp.Or(c.url, os.Getenv("SANDBOXD_URL"), "http://"+defaultListen), "/")
	token := cmp.Or(c.token, os.Getenv("SANDBOXD_TOKEN"))
	if token == "" {
		return nil, errors.New("no token: set SANDBOXD_TOKEN (sandboxd serve prints one in development) or pass --token")
	}
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 300 {
		defer res.Body.Close()
		var e struct{ Error, Message string }
		data, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(data))
		}
		return nil, fmt.Errorf("%s (%d %s)", e.Message, res.StatusCode, cmp.Or(e.Error, http.StatusText(res.StatusCode)))
	}
	if out == nil {
		return res, nil // the caller reads the body
	}
	defer res.Body.Close()
	return res, json.NewDecoder(res.Body).Decode(out)
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
	args:    "[--grant fs.write] [--grant shell.exec] [--always read,edit,shell] [--visible GLOB]... [--commit GLOB]... [--image IMAGE] [--egress PRESET|HOST:PORT]... [--lifetime D] [--idle-timeout D] [--json]",
	summary: "create a session on a running daemon and print its ID",
	setup: func(fs *flag.FlagSet) runFunc {
		var c daemonClient
		c.register(fs)
		var grants, always, egress listFlag
		fs.Var(&grants, "grant", "a `permission` to give: fs.write or shell.exec; repeatable")
		fs.Var(&egress, "egress", "a `rule` of what the session's commands may reach, within the daemon's egress.allow: a preset or HOST:PORT; repeatable (default: the daemon's; \"\" for none)")
		fs.Var(&always, "always", "`skills` active from the first step: read, edit, shell")
		image := fs.String("image", "", "the container `image` (default: the daemon's)")
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
			st := runner.Settings{Image: *image, Grants: grants.values, Lifetime: runner.Duration(*lifetime), IdleTimeout: runner.Duration(*idle),
				Scope: scope.Rules{Visible: visible, Commit: commit}}
			if always.set {
				st.Always = always.values
			}
			if egress.set {
				st.Egress = append([]string{}, egress.values...)
			}
			var info runner.Info
			if _, err := c.do(ctx, "POST", "/v1/sessions", st, &info); err != nil {
				return err
			}
			if *asJSON {
				return printJSON(sio.out, info)
			}
			fmt.Fprintln(sio.out, info.ID)
			return nil
		}
	},
}

var cmdSessionList = &command{
	name:    "session ls",
	args:    "[--json]",
	summary: "list the tenant's sessions on a running daemon",
	setup: func(fs *flag.FlagSet) runFunc {
		var c daemonClient
		c.register(fs)
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			var list struct {
				Sessions []runner.Info `json:"sessions"`
			}
			if _, err := c.do(ctx, "GET", "/v1/sessions", nil, &list); err != nil {
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
	args:    "ID...",
	summary: "end sessions on a running daemon (calls in flight are cancelled, workspaces removed)",
	setup: func(fs *flag.FlagSet) runFunc {
		var c daemonClient
		c.register(fs)
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) == 0 {
				return usagef("name at least one session")
			}
			var errs []error
			for _, id := range args {
				res, err := c.do(ctx, "DELETE", "/v1/sessions/"+id, nil, nil)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
					continue
				}
				res.Body.Close()
			}
			return errors.Join(errs...)
		}
	},
}

var cmdSessionCall = &command{
	name:    "session call",
	args:    "[--json] ID TOOL [ARGUMENTS-JSON]",
	summary: "call a tool of a session on a running daemon; bash output is shown as it arrives",
	setup: func(fs *flag.FlagSet) runFunc {
		var c daemonClient
		c.register(fs)
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
			res, err := c.do(ctx, "POST", "/v1/sessions/"+args[0]+"/tools/"+args[1],
				map[string]any{"arguments": args3}, nil, "Accept", "text/event-stream, application/json")
			if err != nil {
				return err
			}
			defer res.Body.Close()
			result, streamed, err := readCallAnswer(res, sio.out, *asJSON)
			if err != nil {
				return err
			}
			if *asJSON {
				err = printJSON(sio.out, result)
			} else if len(result.Content) > 0 {
				text := result.Content[0].Text
				if streamed != "" {
					// The output has been shown as it came; print what follows it.
					text = strings.TrimPrefix(strings.TrimPrefix(text, streamed), "\n")
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

// readCallAnswer reads a call's answer: JSON, or server-sent events whose
// output is copied to live as it arrives (unless quiet). It returns the
// result and the output shown.
func readCallAnswer(res *http.Response, live io.Writer, quiet bool) (httpapi.CallResult, string, error) {
	var result httpapi.CallResult
	if !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		return result, "", json.NewDecoder(res.Body).Decode(&result)
	}
	var shown strings.Builder
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 64<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			event = name
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		switch event {
		case "output":
			var p struct{ Text string }
			if json.Unmarshal([]byte(data), &p) == nil && !quiet {
				io.WriteString(live, p.Text)
				shown.WriteString(p.Text)
			}
		case "result":
			return result, shown.String(), json.Unmarshal([]byte(data), &result)
		case "error":
			var e struct{ Error, Message string }
			json.Unmarshal([]byte(data), &e)
			return result, "", fmt.Errorf("%s (%s)", e.Message, e.Error)
		}
	}
	if err := sc.Err(); err != nil {
		return result, "", err
	}
	return result, "", errors.New("the daemon ended the stream without a result")
}
