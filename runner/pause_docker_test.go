package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// stopped fails t unless the engine says the container name runs no
// process: stopped, not frozen, so its memory is given back.
func stopped(t *testing.T, cli *client.Client, name string) {
	t.Helper()
	res, err := cli.ContainerInspect(context.Background(), name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatalf("the paused session's container: %v", err)
	}
	if st := res.Container.State; st == nil || st.Running || st.Paused || st.Pid != 0 {
		t.Fatalf("the paused session's container is %+v: want stopped, no process", st)
	}
}

// TestDockerPauseResume: a paused session's container is stopped (no
// process holds memory), its calls fail with ErrPaused, its idle time is
// not counted; resumed, it has the same ID, settings and files, a new
// command runs, and bash_output of the background command the pause ended
// says so. Paused again, it survives a restart of the daemon, paused, and
// resumes there.
func TestDockerPauseResume(t *testing.T) {
	state := t.TempDir()
	m, cli := durableManager(t, state, runner.WithSweepInterval(50*time.Millisecond), runner.WithJournalStores(privateJournals))
	defer m.Shutdown(context.Background())
	st := shell
	st.IdleTimeout = runner.Duration(2 * time.Second)
	st.Lifetime = runner.Duration(time.Hour)
	s := create(t, m, "acme", st)
	if br, res := bash(t, s, "echo kept > f"); br == nil || br.ExitCode != 0 {
		t.Fatal(res.Text)
	}
	bg, err := s.Call(context.Background(), "bash", json.RawMessage(`{"command":"sleep 300","background":true}`), tools.CallOptions{})
	if err != nil || bg.IsError {
		t.Fatalf("background: %v %s", err, bg.Text)
	}
	running, err := s.Detach(runner.DetachRequest{Tool: "bash", Args: json.RawMessage(`{"command":"sleep 120","timeout":200}`)})
	if err != nil {
		t.Fatal(err)
	}
	was := s.Info()

	in, err := m.Pause(context.Background(), "acme", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if in.State != runner.StatePaused || in.ID != s.ID() || in.PausedAt == nil {
		t.Fatalf("paused as %+v", in)
	}
	stopped(t, cli, was.Workspace)
	if _, err := m.Get("acme", s.ID()); !errors.Is(err, runner.ErrPaused) || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("Get of a paused session: %v", err)
	}
	if _, err := s.Call(context.Background(), "read", json.RawMessage(`{"path":"f"}`), tools.CallOptions{}); !errors.Is(err, runner.ErrPaused) {
		t.Fatalf("a call to the paused session: %v", err)
	}
	if _, err := m.Get("other", s.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("another tenant's Get of the paused session: %v", err)
	}
	// Past its idle timeout while paused: kept.
	time.Sleep(3 * time.Second)
	if d, err := m.Describe("acme", s.ID()); err != nil || d.State != runner.StatePaused {
		t.Fatalf("the paused session past its idle timeout: %+v %v", d, err)
	}
	if list := m.Sessions("acme"); len(list) != 1 || list[0].State != runner.StatePaused {
		t.Fatalf("the tenant's sessions: %+v", list)
	}

	back, err := m.Resume(context.Background(), "acme", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	now := back.Info()
	if now.ID != was.ID || now.Workspace != was.Workspace || !now.Created.Equal(was.Created) || now.State != runner.StateRunning ||
		now.ExpiresAt == nil || !now.ExpiresAt.Equal(*was.ExpiresAt) {
		t.Fatalf("resumed as %+v, was %+v", now, was)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file after the resume: %q", got)
	}
	// What it keeps beside its record comes back too: its diff since its
	// start is whole.
	if len(now.Lost) != 0 {
		t.Fatalf("the resumed session lost %q", now.Lost)
	}
	if patch, err := diffOf(context.Background(), back); err != nil || !strings.Contains(patch, "+++ b/f\n") {
		t.Fatalf("the diff since its start after the resume: %v\n%s", err, patch)
	}
	// The detached call the pause cut short says so, naming the pause.
	if _, err := back.Detached(running.ID); !errors.Is(err, runner.ErrInterrupted) || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("the detached call after the resume: %v, want ErrInterrupted naming the pause", err)
	}
	if br, res := bash(t, back, "echo again"); br == nil || br.ExitCode != 0 || !strings.Contains(res.Text, "again") {
		t.Fatalf("a command after the resume: %s", res.Text)
	}
	out, err := back.Call(context.Background(), "bash_output", json.RawMessage(`{"id":"bg1"}`), tools.CallOptions{})
	if err != nil || !strings.Contains(out.Text, "paused") {
		t.Fatalf("bash_output of the command the pause ended: %v %s", err, out.Text)
	}
	nb, err := back.Call(context.Background(), "bash", json.RawMessage(`{"command":"echo new","background":true}`), tools.CallOptions{})
	if r, _ := nb.Structured.(*tools.BackgroundResult); err != nil || r == nil || r.ID == "bg1" {
		t.Fatalf("a new background command after the resume: %v %s", err, nb.Text)
	}

	// Paused, then the daemon restarts: the next run keeps it paused.
	if _, err := m.Pause(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped(t, cli, was.Workspace)
	again, _ := durableManager(t, state, runner.WithEndOnShutdown(true))
	defer again.Shutdown(context.Background())
	if d, err := again.Describe("acme", s.ID()); err != nil || d.State != runner.StatePaused {
		t.Fatalf("the paused session after a restart: %+v %v", d, err)
	}
	stopped(t, cli, was.Workspace)
	if _, err := again.Get("acme", s.ID()); !errors.Is(err, runner.ErrPaused) {
		t.Fatalf("Get of the paused session after a restart: %v", err)
	}
	back, err = again.Resume(context.Background(), "acme", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file after the restart and resume: %q", got)
	}
	if err := again.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerInspect(context.Background(), was.Workspace, client.ContainerInspectOptions{}); err == nil {
		t.Fatal("the deleted session's container is left")
	}
}

// TestDockerAutoResume: WithAutoResume, a request for a paused session
// resumes it; a paused session past its lifetime is removed.
func TestDockerAutoResume(t *testing.T) {
	m, cli := durableManager(t, t.TempDir(), runner.WithAutoResume(true), runner.WithSweepInterval(50*time.Millisecond))
	defer m.Shutdown(context.Background())
	s := create(t, m, "acme", shell)
	if br, res := bash(t, s, "echo kept > f"); br == nil || br.ExitCode != 0 {
		t.Fatal(res.Text)
	}
	if _, err := m.Pause(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	stopped(t, cli, s.Info().Workspace)
	back, err := m.Get("acme", s.ID())
	if err != nil {
		t.Fatalf("Get of a paused session with auto-resume: %v", err)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file: %q", got)
	}

	short := shell
	short.Lifetime = runner.Duration(4 * time.Second)
	brief := create(t, m, "acme", short)
	if _, err := m.Pause(context.Background(), "acme", brief.ID()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := m.Describe("acme", brief.ID())
		if errors.Is(err, runner.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a paused session past its lifetime: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := cli.ContainerInspect(context.Background(), brief.Info().Workspace, client.ContainerInspectOptions{}); err == nil {
		t.Fatal("the expired paused session's container is left")
	}
}

// faultyEngine is the engine, but for the faults a test turns on: a stop
// refused or held until its context ends, an attach or a start refused.
type faultyEngine struct {
	*client.Client
	stopRefused, stopHeld, attachRefused, startRefused atomic.Bool
}

var errRefused = errors.New("the engine refuses (a test's fault)")

func (e *faultyEngine) ContainerStop(ctx context.Context, id string, o client.ContainerStopOptions) (client.ContainerStopResult, error) {
	switch {
	case e.stopHeld.Load():
		<-ctx.Done()
		return client.ContainerStopResult{}, ctx.Err()
	case e.stopRefused.Load():
		return client.ContainerStopResult{}, errRefused
	}
	return e.Client.ContainerStop(ctx, id, o)
}

func (e *faultyEngine) ContainerAttach(ctx context.Context, id string, o client.ContainerAttachOptions) (client.ContainerAttachResult, error) {
	if e.attachRefused.Load() {
		return client.ContainerAttachResult{}, errRefused
	}
	return e.Client.ContainerAttach(ctx, id, o)
}

func (e *faultyEngine) ContainerStart(ctx context.Context, id string, o client.ContainerStartOptions) (client.ContainerStartResult, error) {
	if e.startRefused.Load() {
		return client.ContainerStartResult{}, errRefused
	}
	return e.Client.ContainerStart(ctx, id, o)
}

// heal turns every fault off.
func (e *faultyEngine) heal() {
	for _, f := range []*atomic.Bool{&e.stopRefused, &e.stopHeld, &e.attachRefused, &e.startRefused} {
		f.Store(false)
	}
}

// TestDockerPauseFails: a pause the engine fails — the stop refused, or
// held past the pause's context — leaves the session running with its ID,
// files and workspace, a new command runs, and the error names the cause,
// of its kind (Unavailable, Timeout), counted by outcome. When the
// workspace cannot be brought back either (its attach refused too), the
// session stays paused and a Resume brings it back once the engine
// answers. A resume the engine fails (its start refused) leaves the
// session paused, the error naming the fix.
func TestDockerPauseFails(t *testing.T) {
	e := &faultyEngine{Client: dockertest.Client(t)}
	m, cli := dockerManagerOn(t, &docker.Backend{Client: e})
	defer m.Shutdown(context.Background())
	s := create(t, m, "acme", shell)
	if br, res := bash(t, s, "echo kept > f"); br == nil || br.ExitCode != 0 {
		t.Fatal(res.Text)
	}
	ws := s.Info().Workspace
	ops := func(op, outcome string) uint64 {
		if st := m.Stats().Snapshots; st != nil {
			return st.Ops[[2]string{op, outcome}]
		}
		return 0
	}
	for _, tc := range []struct {
		name    string
		fault   *atomic.Bool
		bound   time.Duration
		kind    *workspace.Kind
		outcome string
	}{
		{"stop refused", &e.stopRefused, 0, workspace.ErrUnavailable, "failed"},
		{"stop held past the pause's context", &e.stopHeld, 3 * time.Second, workspace.ErrTimeout, "timeout"},
	} {
		tc.fault.Store(true)
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if tc.bound > 0 {
			ctx, cancel = context.WithTimeout(ctx, tc.bound)
		}
		_, err := m.Pause(ctx, "acme", s.ID())
		cancel()
		e.heal()
		if err == nil || workspace.KindOf(err) != tc.kind || !strings.Contains(err.Error(), "runs on") ||
			(tc.kind == workspace.ErrUnavailable && !strings.Contains(err.Error(), errRefused.Error())) {
			t.Fatalf("%s: Pause: %v (kind %v), want %v naming the cause, saying it runs on", tc.name, err, workspace.KindOf(err), tc.kind)
		}
		back, err := m.Get("acme", s.ID())
		if err != nil {
			t.Fatalf("%s: the session after its failed pause: %v", tc.name, err)
		}
		if in := back.Info(); in.State != runner.StateRunning || in.Workspace != ws {
			t.Fatalf("%s: after the failed pause: %+v", tc.name, in)
		}
		if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
			t.Fatalf("%s: its file: %q", tc.name, got)
		}
		if br, res := bash(t, back, "echo again"); br == nil || !strings.Contains(br.Output, "again") {
			t.Fatalf("%s: a command after the failed pause: %s", tc.name, res.Text)
		}
		if n := ops("pause", tc.outcome); n != 1 {
			t.Fatalf("%s: %d pauses counted %s, want 1", tc.name, n, tc.outcome)
		}
	}

	// Neither stopped nor brought back: kept paused, for a later Resume.
	e.stopRefused.Store(true)
	e.attachRefused.Store(true)
	_, err := m.Pause(context.Background(), "acme", s.ID())
	e.heal()
	if err == nil || !strings.Contains(err.Error(), "stays paused") || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("Pause that cannot bring the session back: %v, want it kept paused, naming resume", err)
	}
	if d, err := m.Describe("acme", s.ID()); err != nil || d.State != runner.StatePaused {
		t.Fatalf("the session after a pause that could not bring it back: %+v %v", d, err)
	}
	// Its container runs on (the engine refused to stop it): the resume
	// attaches to it again.
	back, err := m.Resume(context.Background(), "acme", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file after the resume: %q", got)
	}

	// A resume the engine fails: still paused, and resumable.
	if _, err := m.Pause(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	e.startRefused.Store(true)
	_, err = m.Resume(context.Background(), "acme", s.ID())
	e.heal()
	if err == nil || !strings.Contains(err.Error(), "stays paused") || !strings.Contains(err.Error(), errRefused.Error()) {
		t.Fatalf("Resume the engine fails: %v, want it kept paused, naming the cause", err)
	}
	if d, err := m.Describe("acme", s.ID()); err != nil || d.State != runner.StatePaused {
		t.Fatalf("the session after a failed resume: %+v %v", d, err)
	}
	if n := ops("resume", "failed"); n != 1 {
		t.Fatalf("%d resumes counted failed, want 1", n)
	}
	stopped(t, cli, ws)
	back, err = m.Resume(context.Background(), "acme", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file after the failed resume and a resume: %q", got)
	}
}
