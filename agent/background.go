package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// The agent keeps background commands itself (workspace.BackgroundBash):
// a workspace.Jobs of the Server's, beside the commands in the container,
// so that they, their output and how they ended outlive the connection
// that started them — a daemon's restart, a replica's takeover. Their
// output stays in the agent's ring, inside the container's quotas, until a
// read fetches it: a command that writes without pause costs the host
// nothing.

var _ workspace.BackgroundBash = (*Client)(nil)

// StartBackground starts a background command in the agent; see
// workspace.BackgroundBash.
func (c *Client) StartBackground(ctx context.Context, req workspace.BackgroundRequest) (workspace.BackgroundStatus, error) {
	cmd := req.Command
	if cmd.Stdin != nil || cmd.Output != nil {
		return workspace.BackgroundStatus{}, workspace.Errorf(workspace.ErrInvalidArgument, "a background command's Output and Stdin are its ring and BackgroundRequest.Stdin")
	}
	if err := c.backgroundKept(); err != nil {
		return workspace.BackgroundStatus{}, err
	}
	r := request{Op: opBgStart, Name: cmd.Dir, Bg: &bgRequest{
		Run:   &runRequest{Script: cmd.Script, Argv: cmd.Argv, Dir: cmd.Dir, Env: cmd.Env, Timeout: cmd.Timeout, Combined: cmd.Combined},
		Stdin: req.Stdin, Keep: req.Keep, Max: req.Max, Label: req.Name,
	}}
	return jsonCall(c, ctx, r, func(body []byte) (workspace.BackgroundStatus, error) {
		var st workspace.BackgroundStatus
		if err := json.Unmarshal(body, &st); err != nil {
			return st, err
		}
		return st, checkStatus(st, "")
	})
}

// ReadBackground reads a background command of the agent; see
// workspace.BackgroundBash.
func (c *Client) ReadBackground(ctx context.Context, id string, wait time.Duration) (workspace.BackgroundRead, error) {
	return c.backgroundRead(ctx, opBgRead, id, wait)
}

// KillBackground stops a background command of the agent; see
// workspace.BackgroundBash.
func (c *Client) KillBackground(ctx context.Context, id string) (workspace.BackgroundRead, error) {
	return c.backgroundRead(ctx, opBgKill, id, 0)
}

func (c *Client) backgroundRead(ctx context.Context, op, id string, wait time.Duration) (workspace.BackgroundRead, error) {
	if err := c.backgroundKept(); err != nil {
		return workspace.BackgroundRead{}, err
	}
	r := request{Op: op, Name: id, Bg: &bgRequest{ID: id, Wait: wait}}
	return jsonCall(c, ctx, r, func(body []byte) (workspace.BackgroundRead, error) {
		var rd workspace.BackgroundRead
		if err := json.Unmarshal(body, &rd); err != nil {
			return rd, err
		}
		if err := checkStatus(rd.BackgroundStatus, id); err != nil {
			return rd, err
		}
		if rd.Dropped < 0 || int64(len(rd.Output)) > rd.OutputBytes {
			return rd, fmt.Errorf("a read of %d bytes, %d dropped, of %d written", len(rd.Output), rd.Dropped, rd.OutputBytes)
		}
		return rd, nil
	})
}

// ListBackground lists the agent's background commands; see
// workspace.BackgroundBash.
func (c *Client) ListBackground(ctx context.Context) ([]workspace.BackgroundStatus, error) {
	if err := c.backgroundKept(); err != nil {
		return nil, err
	}
	return jsonCall(c, ctx, request{Op: opBgList}, func(body []byte) ([]workspace.BackgroundStatus, error) {
		var list []workspace.BackgroundStatus
		if err := json.Unmarshal(body, &list); err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, st := range list {
			if err := checkStatus(st, ""); err != nil {
				return nil, err
			}
			if seen[st.ID] {
				return nil, fmt.Errorf("background command %s listed twice", st.ID)
			}
			seen[st.ID] = true
		}
		return list, nil
	})
}

// backgroundKept fails when the agent said in its Hello that it keeps no
// background commands (it predates them, or runs none).
func (c *Client) backgroundKept() error {
	if !c.info.Background {
		return workspace.Errorf(workspace.ErrUnavailable, "the agent keeps no background commands (build %s)", c.info.Build)
	}
	return nil
}

var backgroundID = regexp.MustCompile(`^bg[0-9]{1,12}$`)

// checkStatus checks a background command's state from the agent: a
// well-formed ID (want's, when set), counts that can be, a result that can
// be, and a known error kind.
func checkStatus(st workspace.BackgroundStatus, want string) error {
	switch {
	case !backgroundID.MatchString(st.ID) || want != "" && st.ID != want:
		return fmt.Errorf("background command %q", clip(st.ID))
	case st.OutputBytes < 0 || st.Unread < 0 || st.Unread > st.OutputBytes:
		return fmt.Errorf("background command %s: %d bytes unread of %d", st.ID, st.Unread, st.OutputBytes)
	case st.Running && (!st.Ended.IsZero() || st.Killed || st.Err != ""):
		return fmt.Errorf("background command %s runs and has ended", st.ID)
	case st.Result.ExitCode < -1 || st.Result.ExitCode > 255 || st.Result.Duration < 0 || !validSignal(st.Result.Signal):
		return fmt.Errorf("background command %s: bad result %+v", st.ID, st.Result)
	case st.ErrKind != "" && workspace.KindByName(st.ErrKind) == nil:
		return fmt.Errorf("background command %s: unknown error kind %q", st.ID, clip(st.ErrKind))
	case len(st.Err) > maxErrorText || len(st.Command) > MaxFrame:
		return fmt.Errorf("background command %s: an error or command too long", st.ID)
	}
	return nil
}

// background serves the bg* operations from the server's Jobs.
func (c *serverConn) background(call *serverCall) ([]byte, error) {
	js, req := c.s.jobs, call.req
	if js == nil {
		return nil, &RemoteError{Kind: workspace.ErrForbidden, Msg: "this agent runs no commands"}
	}
	if req.Op == opBgList {
		list, err := js.ListBackground(call.ctx)
		if err != nil {
			return nil, err
		}
		return json.Marshal(list)
	}
	if req.Bg == nil || req.Op == opBgStart && req.Bg.Run == nil {
		return nil, &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: req.Op + " without its arguments"}
	}
	var v any
	var err error
	switch b := req.Bg; req.Op {
	case opBgStart:
		r := b.Run
		v, err = js.StartBackground(call.ctx, workspace.BackgroundRequest{
			Command: workspace.Command{Script: r.Script, Argv: r.Argv, Dir: r.Dir, Env: r.Env, Timeout: r.Timeout, Combined: r.Combined},
			Stdin:   b.Stdin, Keep: b.Keep, Max: b.Max, Name: b.Label,
		})
	case opBgRead:
		v, err = js.ReadBackground(call.ctx, b.ID, b.Wait)
	case opBgKill:
		v, err = js.KillBackground(call.ctx, b.ID)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
