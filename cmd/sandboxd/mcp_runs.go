package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/policy"
)

// A run of `sandboxd mcp` over a copy (memory, docker) keeps what its
// work needs in a directory of its own, $XDG_STATE_HOME/sandboxd/mcp/runs/RUN,
// from before the copy until the work is delivered, so that a run killed
// at any moment (SIGKILL, the OOM killer, a client that vanished and took
// the process group with it) loses nothing a later run cannot deliver:
//
//	run.json   the workspace, the backend, the session, how to deliver
//	delivery/  the baseline the work is measured against, and the journal
//	           of a delivery begun (delivery.Keep), locked while the run
//	           has it open: a run whose baseline is not locked has ended
//
// Everything a Docker run makes carries the label labelMCPRun naming the
// directory, so that the container of a killed run — which holds the only
// copy of the agent's work — is found from the record and the record from
// the container: no run reaps a container whose run directory keeps a
// baseline (its work is undelivered); the next run for the same workspace
// delivers it, as the killed run would have, and only then removes it.
// Where the directory is gone, the container's work is harvested as a
// patch before it is removed.
type mcpRun struct {
	dir  string
	rec  runRecord
	base *delivery.Baseline // nil until begin, or when none was kept
}

// runRecord is what run.json holds.
type runRecord struct {
	Workspace string    `json:"workspace"`
	Backend   string    `json:"backend"`
	Session   string    `json:"session,omitempty"`
	Deliver   string    `json:"deliver"`
	Patch     string    `json:"patch,omitempty"`
	Created   time.Time `json:"created"`
	// Owner is the run's process.
	Owner backend.Owner `json:"owner"`
	// Delivered: the work is delivered; what is left (the container) may go.
	Delivered bool `json:"delivered,omitempty"`
	// Daemon is the runner's daemon name of a Docker run, under which the
	// run's directory keeps its session's record (docker.Backend.StateDir)
	// for a run that resumes it (--resume); "" for runs of earlier
	// versions, which cannot be resumed.
	Daemon string `json:"daemon,omitempty"`
}

// labelMCPRun, on what a Docker run of mcp makes, names its run directory;
// runDiscard is its value for a run whose work is not delivered (tools,
// --deliver none): a killed one's container is removed as it is.
const (
	labelMCPRun = "sandboxd.mcp.run"
	runDiscard  = "discard"
)

const (
	runFile   = "run.json"
	runKeep   = "delivery"
	runPrefix = "r-"
)

// mcpRunsDir is where runs keep their directories, made private if missing.
func mcpRunsDir() (string, error) {
	state, err := stateDir()
	if err != nil {
		return "", fmt.Errorf("no state directory for the session's work: %w", err)
	}
	dir := filepath.Join(state, "mcp", "runs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("the state directory for the session's work: %w", err)
	}
	return dir, nil
}

// newRun makes the directory of a new run and writes its record; begin
// then keeps its baseline there.
func newRun(rec runRecord) (*mcpRun, error) {
	root, err := mcpRunsDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(root, runPrefix)
	if err != nil {
		return nil, err
	}
	rec.Created, rec.Owner = time.Now().UTC(), backend.Self()
	r := &mcpRun{dir: dir, rec: rec}
	if err := r.save(); err != nil {
		r.discard()
		return nil, err
	}
	return r, nil
}

// begin reads workspace into the run's baseline, kept in its directory.
func (r *mcpRun) begin(ctx context.Context, workspace string) (*delivery.Baseline, error) {
	base, err := delivery.Begin(ctx, workspace, delivery.Keep(r.keep()))
	r.base = base
	return base, err
}

// keep is where the run's baseline is kept (delivery.Keep).
func (r *mcpRun) keep() string { return filepath.Join(r.dir, runKeep) }

// save writes run.json under a temporary name and renames it into place.
func (r *mcpRun) save() error {
	data, err := json.MarshalIndent(r.rec, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(r.dir, runFile), data)
}

// release lets go of the run's baseline and leaves its directory.
func (r *mcpRun) release() {
	if r.base != nil {
		r.base.Close()
	}
}

// discard removes the run's directory: its work is delivered, or gone.
func (r *mcpRun) discard() error {
	err := os.RemoveAll(r.dir)
	r.release()
	return err
}

// endedRuns returns the runs whose process has ended that want accepts,
// each with its baseline open (and so locked) by this process, or none
// when it kept none. A run whose process ended may be held for a moment by
// another run looking at it (or for longer, by one delivering its work):
// its baseline is waited for up to lockWait, then left to that one. A
// directory without a readable record, a minute old (its run was killed as
// it began), comes with a zero record.
func endedRuns(want func(*mcpRun) bool) ([]*mcpRun, error) {
	root, entries, err := runDirs()
	if err != nil {
		return nil, err
	}
	var out []*mcpRun
	for _, e := range entries {
		r := &mcpRun{dir: filepath.Join(root, e.Name())}
		if r.rec, err = readRun(r.dir); err == nil {
			if !r.rec.Owner.Gone() || !want(r) {
				continue
			}
		} else if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		for deadline := time.Now().Add(lockWait); ; time.Sleep(50 * time.Millisecond) {
			if r.base, err = delivery.Open(r.keep()); !errors.Is(err, delivery.ErrInUse) || time.Now().After(deadline) {
				break
			}
		}
		switch {
		case err == nil || errors.Is(err, fs.ErrNotExist):
			out = append(out, r)
		case !errors.Is(err, delivery.ErrInUse):
			return out, err
		}
	}
	return out, nil
}

// runDirs returns the runs' directory and the entries of the runs in it.
func runDirs() (root string, runs []os.DirEntry, _ error) {
	root, err := mcpRunsDir()
	if err != nil {
		return "", nil, err
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return "", nil, err
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), runPrefix) {
			runs = append(runs, e)
		}
	}
	return root, runs, nil
}

// lockWait bounds the wait for the lock of a run whose process has ended.
const lockWait = 5 * time.Second

// runKept reports whether the run directory dir — named by a container's
// labelMCPRun — keeps the baseline of work not yet delivered, or a living
// run holds it (one that resumed the session of a container whose labels
// name the killed run, up to its container's removal): the container must
// stay until that work is delivered, by that run or the next.
func runKept(dir string) bool {
	if dir == "" || !filepath.IsAbs(dir) {
		return false
	}
	rec, err := readRun(dir)
	if err != nil {
		return false
	}
	if !rec.Owner.Gone() {
		return true
	}
	if rec.Delivered {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, runKeep, "baseline.json"))
	return err == nil
}

// settleRuns deals with what ended runs of mcp left, before this run copies
// workspace: a delivery begun is finished (whatever its workspace);
// the work of a killed Docker run on this workspace is delivered from its
// container, as that run would have delivered it, and the container
// removed; a killed memory run's work ended with it, and is said so.
// Killed Docker runs of other workspaces are left for their own next run,
// and named. cli, nil but for the docker backend, reaches the containers.
func settleRuns(ctx context.Context, sio stdio, cli client.APIClient, workspace string) {
	abs, _ := filepath.Abs(workspace)
	runs, err := endedRuns(func(r *mcpRun) bool {
		rec := r.rec
		if rec.Backend == "docker" && rec.Workspace != abs && isDir(rec.Workspace) && !delivery.Interrupted(r.keep()) {
			fmt.Fprintf(sio.err, "sandboxd: session %s of %s, left by a killed run, keeps its container with its work until 'sandboxd mcp --backend docker --workspace %s' delivers it, or 'sandboxd mcp --workspace %s --resume %s' continues it\n",
				rec.Session, rec.Workspace, rec.Workspace, rec.Workspace, rec.Session)
			return false
		}
		return true
	})
	if err != nil {
		fmt.Fprintf(sio.err, "sandboxd: looking for the work of killed runs: %v\n", err)
		return
	}
	for _, r := range runs {
		if err := settleRun(ctx, sio, cli, r); err != nil {
			fmt.Fprintf(sio.err, "sandboxd: the work of killed run %s (session %s of %s) is not delivered: %v; it stays in %s for the next run\n",
				filepath.Base(r.dir), r.rec.Session, r.rec.Workspace, err, r.dir)
			r.release()
		}
	}
}

func isDir(name string) bool {
	info, err := os.Stat(name)
	return err == nil && info.IsDir()
}

// settleRun delivers what run r, which has ended, left undelivered.
func settleRun(ctx context.Context, sio stdio, cli client.APIClient, r *mcpRun) error {
	say := func(format string, a ...any) { fmt.Fprintf(sio.err, "sandboxd: "+format+"\n", a...) }
	base := r.base
	if base == nil || r.rec.Delivered {
		// Killed before its baseline was kept (its container, if any,
		// holds nothing of the agent's yet), or after its work was
		// delivered.
		return errors.Join(removeRunContainers(ctx, cli, r), r.discard())
	}
	req := delivery.Request{Mode: delivery.Mode(r.rec.Deliver), Session: r.rec.Session, PatchFile: r.rec.Patch}
	switch {
	case base.Interrupted():
		rep, err := base.Deliver(ctx, nil, req)
		if rep != nil {
			fmt.Fprint(sio.err, rep)
		}
		if err != nil {
			return err
		}
		rememberDelivered(sio, r.rec.Session, r.rec.Workspace, rep)
	case r.rec.Backend != "docker":
		say("session %s of %s (backend %s), in a run that was killed, ended with it: its work was in that process's memory, and is lost", r.rec.Session, r.rec.Workspace, r.rec.Backend)
		return r.discard()
	case cli == nil:
		r.release() // a Docker run's, and this one does not reach the engine
		return nil
	default:
		id, session, err := runContainer(ctx, cli, r.dir)
		if err != nil {
			return err
		}
		if req.Session == "" { // killed before it could say
			req.Session, r.rec.Session = session, session
		}
		if id == "" {
			say("session %s of %s, in a run that was killed, has no container any more: its work is lost", r.rec.Session, r.rec.Workspace)
			return r.discard()
		}
		say("delivering the work of session %s, which a killed run left in its container (to continue a killed run's session instead, start 'sandboxd mcp --resume SESSION' before any other run for its workspace; 'sandboxd mcp --list' lists them)", r.rec.Session)
		rep, err := deliverContainer(ctx, cli, id, base, req)
		if rep != nil {
			fmt.Fprint(sio.err, rep)
		}
		if err != nil {
			return err
		}
		rememberDelivered(sio, r.rec.Session, r.rec.Workspace, rep)
	}
	r.rec.Delivered = true
	if err := r.save(); err != nil {
		return err
	}
	return errors.Join(removeRunContainers(ctx, cli, r), r.discard())
}

// deliverContainer delivers the work in the workspace of container id
// against base, read through the engine (the container's agent has no
// client any more).
func deliverContainer(ctx context.Context, cli client.APIClient, id string, base *delivery.Baseline, req delivery.Request) (*delivery.Report, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(docker.ExportWorkspace(ctx, cli, id, pw)) }()
	rep, err := base.DeliverArchive(ctx, pr, req)
	pr.CloseWithError(errors.New("the delivery ended"))
	return rep, err
}

// runContainer returns the ID and session of the session container of run
// directory dir, or "" when there is none.
func runContainer(ctx context.Context, cli client.APIClient, dir string) (id, session string, _ error) {
	f := make(client.Filters)
	f.Add("label", labelMCPRun+"="+dir)
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return "", "", fmt.Errorf("looking for its container: %w", err)
	}
	for _, ct := range list.Items {
		if s := ct.Labels[policy.LabelSession]; s != "" {
			return ct.ID, s, nil
		}
	}
	return "", "", nil
}

// removeRunContainers removes what run r made on the engine.
func removeRunContainers(ctx context.Context, cli client.APIClient, r *mcpRun) error {
	if cli == nil || r.rec.Backend != "docker" {
		return nil
	}
	_, err := docker.Reap(ctx, cli, map[string]string{labelMCPRun: r.dir}, nil)
	return err
}

// harvest writes the work of the container id, which a killed run left
// with no record of its start, as a patch that adds its whole tree, to the
// default place of its session's patch; it returns the report, nil when
// the workspace holds nothing.
func harvest(ctx context.Context, cli client.APIClient, id, session string) (*delivery.Report, error) {
	base, err := delivery.Nothing()
	if err != nil {
		return nil, err
	}
	defer base.Close()
	rep, err := deliverContainer(ctx, cli, id, base, delivery.Request{Mode: delivery.Patch, Session: session})
	if err != nil && (cerrdefs.IsNotFound(err) || errors.Is(err, fs.ErrNotExist)) {
		return nil, nil
	}
	return rep, err
}
