package tools

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// PastBackground are the background commands of a session's earlier
// workspace, which ended with it (a pause: its processes did not
// survive), and why (Env.PastBackground).
type PastBackground struct {
	Commands []Background
	// Cause says what ended them ("the session was paused at …"), and At
	// when.
	Cause string
	At    time.Time
}

// renumbered is a workspace's background commands after a session's
// earlier ones (PastBackground): the workspace numbers its own from bg1
// again, so they are shown numbered after the past ones, and no ID names
// two commands; the past ones answer as they ended.
type renumbered struct {
	workspace.BackgroundBash
	offset int
	past   []workspace.BackgroundStatus
}

// pastBackground wraps bg, the new workspace's, after past's commands.
func pastBackground(bg workspace.BackgroundBash, past *PastBackground) *renumbered {
	r := &renumbered{BackgroundBash: bg}
	for _, c := range past.Commands {
		if n, ok := bgNumber(c.ID); ok {
			r.offset = max(r.offset, n)
		}
		r.past = append(r.past, workspace.BackgroundStatus{
			ID: c.ID, Command: c.Command, Started: c.Started, Running: false, Killed: c.Killed || c.Running,
			Result:      workspace.Result{ExitCode: c.ExitCode, Signal: c.Signal, TimedOut: c.TimedOut},
			OutputBytes: c.OutputBytes, Ended: past.At,
		})
	}
	return r
}

// bgNumber is N of an ID "bgN".
func bgNumber(id string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "bg"))
	return n, err == nil && strings.HasPrefix(id, "bg") && n > 0
}

// outer is the ID shown for the workspace's own inner.
func (r *renumbered) outer(inner string) string {
	if n, ok := bgNumber(inner); ok {
		return "bg" + strconv.Itoa(n+r.offset)
	}
	return inner
}

// inner is the workspace's own ID of outer, or false for a past one.
func (r *renumbered) inner(outer string) (string, bool) {
	if n, ok := bgNumber(outer); ok && n > r.offset {
		return "bg" + strconv.Itoa(n-r.offset), true
	}
	return outer, !slices.ContainsFunc(r.past, func(st workspace.BackgroundStatus) bool { return st.ID == outer })
}

func (r *renumbered) pastOne(id string) workspace.BackgroundRead {
	i := slices.IndexFunc(r.past, func(st workspace.BackgroundStatus) bool { return st.ID == id })
	return workspace.BackgroundRead{BackgroundStatus: r.past[i]}
}

func (r *renumbered) StartBackground(ctx context.Context, req workspace.BackgroundRequest) (workspace.BackgroundStatus, error) {
	st, err := r.BackgroundBash.StartBackground(ctx, req)
	st.ID = r.outer(st.ID)
	return st, err
}

func (r *renumbered) ReadBackground(ctx context.Context, id string, wait time.Duration) (workspace.BackgroundRead, error) {
	in, ok := r.inner(id)
	if !ok {
		return r.pastOne(id), nil
	}
	rd, err := r.BackgroundBash.ReadBackground(ctx, in, wait)
	rd.ID = r.outer(rd.ID)
	return rd, err
}

func (r *renumbered) KillBackground(ctx context.Context, id string) (workspace.BackgroundRead, error) {
	in, ok := r.inner(id)
	if !ok {
		return r.pastOne(id), nil
	}
	rd, err := r.BackgroundBash.KillBackground(ctx, in)
	rd.ID = r.outer(rd.ID)
	return rd, err
}

func (r *renumbered) ListBackground(ctx context.Context) ([]workspace.BackgroundStatus, error) {
	list, err := r.BackgroundBash.ListBackground(ctx)
	for i := range list {
		list[i].ID = r.outer(list[i].ID)
	}
	return append(slices.Clone(r.past), list...), err
}

// pastCause is why background command id ended with an earlier workspace
// of the session, or "" for one of this workspace's.
func (bg *backgrounds) pastCause(id string) string {
	if r, ok := bg.BackgroundBash.(*renumbered); ok && bg.cause != "" {
		if _, own := r.inner(id); !own {
			return bg.cause
		}
	}
	return ""
}
