package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/delivery"
)

// Continuing a session a killed run left (sandboxd mcp --resume SESSION).
// A Docker run of mcp keeps its session's record in its run directory
// (docker.Backend.StateDir: RUN/docker/daemon-NAME/SESSION.json, with the
// session's journal and first tree beside it) under a daemon name of its
// own, kept in run.json. A run that resumes the session takes the run
// over — its record's owner becomes this process, its baseline's lock
// this process's — and opens the runner under the same daemon name and
// state directory, so that the runner's own resumption after a restart
// (runner.New: backend.Resumer, revive) takes the container back with its
// files, journal, diff baseline, skills and background commands. The
// daemon name's claim (backend.Claimer) and the baseline's lock each make
// a second run resuming the same session fail.

// resumable says why run r cannot be continued, "" when it can, and the
// fix; it is judged from the record alone (resume checks the rest).
func resumable(r *mcpRun) (why, fix string) {
	rec, ws := r.rec, r.rec.Workspace
	deliver := "a plain 'sandboxd mcp --backend docker --workspace " + ws + "' delivers its work"
	switch {
	case rec.Delivered:
		return "its work is delivered", "start a new session"
	case !rec.Owner.Gone():
		return "its run is serving it (" + rec.Owner.String() + ")", "end that run first, or start a new session"
	case rec.Backend != "docker":
		return "it ran on the " + rec.Backend + " backend, whose work was in the killed process's memory", "start a new session"
	case rec.Daemon == "":
		return "its run was made by an earlier version of sandboxd, which kept no record to resume it from", deliver
	case delivery.Interrupted(r.keep()):
		return "a delivery of its work began", "a plain 'sandboxd mcp' finishes it"
	}
	return "", ""
}

// resumeRun takes over the run that left session, for f to open it again
// (f.resume): it checks that the session can be continued here, from DIR
// (f.workspace), with its container running, and refuses naming the fix
// otherwise; it makes the run this process's, then settles what other
// ended runs left (settleRuns). The --deliver and --patch given replace
// the run's. It returns the run and its baseline, locked.
func (d *deliverFlags) resumeRun(ctx context.Context, sio stdio, f *sessionFlags, session string) (*mcpRun, *delivery.Baseline, error) {
	if f.backend != "docker" {
		return nil, nil, usagef("--resume continues a session of --backend docker (the others' sessions end with their process)")
	}
	if d.mode != "" {
		if _, err := delivery.ParseMode(d.mode); err != nil {
			return nil, nil, usagef("--deliver: %v", err)
		}
	}
	abs, err := filepath.Abs(f.workspace)
	if err != nil {
		return nil, nil, err
	}
	r, err := findRun(session)
	if err != nil {
		return nil, nil, err
	}
	refuse := func(why, fix string) error {
		return fmt.Errorf("session %s cannot be resumed: %s; %s", session, why, fix)
	}
	if r.rec.Workspace != abs {
		return nil, nil, refuse("it is a session of "+r.rec.Workspace+", not of "+abs,
			"resume it with --workspace "+r.rec.Workspace)
	}
	if why, fix := resumable(r); why != "" {
		return nil, nil, refuse(why, fix)
	}
	// The run's baseline locked: a run that resumes it too, or delivers
	// it, waits for this one (and the daemon name's claim stops a second
	// resume should the lock be taken between two looks).
	base, err := delivery.Open(r.keep())
	switch {
	case errors.Is(err, delivery.ErrInUse):
		return nil, nil, refuse("another run of sandboxd mcp has it open", "end that run first")
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, refuse("its run was killed before it kept what the work is measured against (its container, if any, holds nothing of the agent's yet)", "start a new session")
	case err != nil:
		return nil, nil, err
	}
	r.base = base
	// Looked at again under the lock: another run may have delivered it,
	// or taken it, since the first look.
	if again, err := readRun(r.dir); err != nil {
		r.release()
		return nil, nil, err
	} else if r.rec = again; !r.rec.Owner.Gone() || r.rec.Delivered {
		r.release()
		why, fix := resumable(r)
		return nil, nil, refuse(why, fix)
	}
	if err := runningContainer(ctx, r); err != nil {
		r.release()
		return nil, nil, refuse(err.Error(), "a plain 'sandboxd mcp --backend docker --workspace "+abs+"' delivers its work")
	}
	r.rec.Owner = backend.Self()
	if d.mode != "" {
		r.rec.Deliver = d.mode
	}
	if d.patch != "" {
		if r.rec.Patch, err = filepath.Abs(d.patch); err != nil {
			r.release()
			return nil, nil, err
		}
	}
	d.mode, d.patch = r.rec.Deliver, r.rec.Patch
	if err := r.save(); err != nil {
		r.release()
		return nil, nil, fmt.Errorf("taking over the record of session %s: %w", session, err)
	}
	d.settle(ctx, sio, f)
	f.labels = map[string]string{labelMCPRun: r.dir}
	f.daemon, f.stateDir, f.resume = r.rec.Daemon, r.dir, session
	return r, base, nil
}

// runningContainer checks that run r's session container runs: the
// runner's resumption removes one that does not (its agent, and so its
// background commands, are gone), and that one's work is delivered
// instead, from its stopped container.
func runningContainer(ctx context.Context, r *mcpRun) error {
	cli, err := dockerClient(ctx)
	if err != nil {
		return fmt.Errorf("the engine does not answer (%v)", err)
	}
	defer cli.Close()
	id, _, err := runContainer(ctx, cli, r.dir)
	if err != nil {
		return err
	}
	if id == "" {
		return errors.New("its container is not on this engine (DOCKER_HOST names another?)")
	}
	res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return fmt.Errorf("its container: %v", err)
	}
	if st := res.Container.State; st == nil || !st.Running || st.Paused {
		return errors.New("its container has stopped (an engine restart, a host reboot?), and with it the agent's commands")
	}
	return nil
}

// findRun returns the run of session, with its record; a session no run
// holds is refused naming what became of it, where that is known.
func findRun(session string) (*mcpRun, error) {
	runs, err := allRuns()
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		if r.rec.Session == session {
			return r, nil
		}
	}
	if d, ok := deliveredSession(session); ok {
		return nil, fmt.Errorf("session %s cannot be resumed: its work was delivered at %s (%s); start a new session",
			session, d.At.Local().Format(time.DateTime), d.To)
	}
	if daemon := serveDaemonOf(session); daemon != "" {
		return nil, fmt.Errorf("session %s cannot be resumed by sandboxd mcp: it is a session of the daemon %q (sandboxd serve); reach it through that daemon's API", session, daemon)
	}
	return nil, fmt.Errorf("no session %s to resume on this host: no run of sandboxd mcp here has it ('sandboxd mcp --list' lists theirs)", session)
}

// allRuns reads the record of every run, living or ended, oldest first;
// a directory without a readable record is left out.
func allRuns() ([]*mcpRun, error) {
	root, entries, err := runDirs()
	if err != nil {
		return nil, err
	}
	var out []*mcpRun
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		if rec, err := readRun(dir); err == nil {
			out = append(out, &mcpRun{dir: dir, rec: rec})
		}
	}
	slices.SortFunc(out, func(a, b *mcpRun) int { return a.rec.Created.Compare(b.rec.Created) })
	return out, nil
}

// readRun reads the record of the run directory dir.
func readRun(dir string) (runRecord, error) {
	var rec runRecord
	data, err := os.ReadFile(filepath.Join(dir, runFile))
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err != nil {
		return runRecord{}, err
	}
	return rec, nil
}

// serveDaemonOf returns the daemon of `sandboxd serve` whose Docker records
// (in the default state directory) hold session, or "".
func serveDaemonOf(session string) string {
	state, err := stateDir()
	if err != nil {
		return ""
	}
	names, _ := filepath.Glob(filepath.Join(state, "docker", "daemon-*", session+".json"))
	if len(names) == 0 {
		return ""
	}
	return strings.TrimPrefix(filepath.Base(filepath.Dir(names[0])), "daemon-")
}

// A delivered session is remembered, for a while, in
// $XDG_STATE_HOME/sandboxd/mcp/delivered/SESSION.json, so that --resume of
// it says what became of it (its run's directory is gone with the work
// delivered); records older than deliveredKept are removed as new ones are
// written.
type deliveredRecord struct {
	Workspace string    `json:"workspace"`
	At        time.Time `json:"at"`
	// To says where the work went, in a few words.
	To string `json:"to"`
}

const deliveredKept = 30 * 24 * time.Hour

func deliveredDir() (string, error) {
	root, err := mcpRunsDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(root), "delivered"), nil
}

// rememberDelivered records that session's work on workspace went where
// rep says. A failure is said on stderr: the work is delivered all the
// same.
func rememberDelivered(sio stdio, session, workspace string, rep *delivery.Report) {
	if session == "" {
		return
	}
	dir, err := deliveredDir()
	if err == nil {
		err = os.MkdirAll(dir, 0o700)
	}
	var data []byte
	if err == nil {
		data, err = json.Marshal(deliveredRecord{Workspace: workspace, At: time.Now().UTC(), To: deliveredTo(rep, workspace)})
	}
	if err == nil {
		err = writeFileAtomic(filepath.Join(dir, session+".json"), data)
	}
	if err != nil {
		fmt.Fprintf(sio.err, "sandboxd: remembering that session %s is delivered: %v\n", session, err)
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > deliveredKept {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// writeFileAtomic writes data to name under a temporary name, renamed
// into place.
func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// deliveredTo says in a few words where rep's work went.
func deliveredTo(rep *delivery.Report, workspace string) string {
	switch {
	case rep == nil:
		return "to " + workspace
	case rep.Committed != nil:
		return "branch " + strings.TrimPrefix(rep.Committed.Branch, "refs/heads/") + " of " + rep.Dir
	case rep.Applied != nil:
		return "applied to " + rep.Dir
	case rep.PatchFile != "":
		return "patch " + rep.PatchFile
	case rep.Mode == delivery.None:
		return "discarded, --deliver none"
	}
	return "nothing to deliver"
}

// deliveredSession reads the record of session's delivery, if kept.
func deliveredSession(session string) (deliveredRecord, bool) {
	var d deliveredRecord
	dir, err := deliveredDir()
	if err != nil || strings.ContainsAny(session, `/\`) {
		return d, false
	}
	data, err := os.ReadFile(filepath.Join(dir, session+".json"))
	return d, err == nil && json.Unmarshal(data, &d) == nil
}

// listRuns prints the sessions of runs of mcp on this host, oldest first:
// those serving, those killed runs left (and what a next run does with
// each), then those delivered lately.
func listRuns(sio stdio) error {
	runs, err := allRuns()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(sio.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SESSION\tWORKSPACE\tSTARTED\tSTATE")
	for _, r := range runs {
		state := "left by a killed run: 'sandboxd mcp --resume " + r.rec.Session + "' continues it; a plain run for its workspace delivers it"
		if why, fix := resumable(r); why != "" {
			state = why + ": " + fix
		}
		if r.rec.Session == "" {
			continue // killed before its session began: nothing of it to name
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.rec.Session, r.rec.Workspace, r.rec.Created.Local().Format(time.DateTime), state)
	}
	if dir, err := deliveredDir(); err == nil {
		names, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, name := range names {
			session := strings.TrimSuffix(filepath.Base(name), ".json")
			if d, ok := deliveredSession(session); ok {
				fmt.Fprintf(w, "%s\t%s\t\tdelivered at %s: %s\n", session, d.Workspace, d.At.Local().Format(time.DateTime), d.To)
			}
		}
	}
	return w.Flush()
}

// keepUntilTaken is the Docker backend of a run that resumes a session:
// until the session is the run's (taken), a failure to take it back
// (runner.revive closing the workspace) leaves its container and record
// (Instance.Leave) rather than removing them with the work in them.
type keepUntilTaken struct {
	*docker.Backend
	taken atomic.Bool
}

var _ backend.Resumer = (*keepUntilTaken)(nil)

// Resume is docker.Backend.Resume, each workspace's Close a Leave until
// taken.
func (k *keepUntilTaken) Resume(ctx context.Context, labels map[string]string) ([]backend.Resumed, error) {
	got, err := k.Backend.Resume(ctx, labels)
	for _, rs := range got {
		inst := rs.Instance
		if inst == nil || inst.Leave == nil {
			continue
		}
		closeWS, leave := inst.Close, inst.Leave
		inst.Close = func(ctx context.Context) error {
			if k.taken.Load() {
				return closeWS(ctx)
			}
			return leave(ctx)
		}
	}
	return got, err
}
