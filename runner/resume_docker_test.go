package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// durableManager is a manager of Docker sessions whose records are kept in
// stateDir, for a daemon of the test's own name.
func durableManager(t *testing.T, stateDir string, opts ...runner.Option) (*runner.Manager, *client.Client) {
	t.Helper()
	return dockerManagerOn(t, &docker.Backend{StateDir: stateDir}, opts...)
}

// readFile is the contents of name in s's workspace, through the read tool.
func readFile(t *testing.T, s *runner.Session, name string) string {
	t.Helper()
	args, _ := json.Marshal(map[string]any{"path": name})
	res, err := s.Call(context.Background(), "read", args, tools.CallOptions{})
	if err != nil || res.IsError {
		t.Fatalf("read %s: %v %s", name, err, res.Text)
	}
	return res.Text
}

// records lists the session records in stateDir.
func records(t *testing.T, stateDir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(stateDir, "docker", "*", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		names[i] = strings.TrimSuffix(filepath.Base(n), ".json")
	}
	return names
}

// TestDockerSessionsOutliveTheManager: a manager that shuts down leaves its
// Docker sessions (their records 0600 in the state directory); the next
// manager of the daemon's name resumes them — the same ID answers, with
// its settings, its expiry and its files — except one idle for longer than
// its idle timeout since the daemon stopped, which is removed. With
// WithEndOnShutdown, Shutdown ends them, records and containers.
func TestDockerSessionsOutliveTheManager(t *testing.T) {
	state := t.TempDir()
	m, cli := durableManager(t, state)
	defer m.Shutdown(context.Background())
	keep := shell
	keep.Lifetime = runner.Duration(time.Hour)
	s := create(t, m, "acme", keep)
	if br, res := bash(t, s, "echo kept > f"); br == nil || br.ExitCode != 0 {
		t.Fatal(res.Text)
	}
	idle := shell
	idle.IdleTimeout = runner.Duration(30 * time.Minute)
	dozing := create(t, m, "acme", idle)
	for _, id := range []string{s.ID(), dozing.ID()} {
		fi, err := os.Stat(filepath.Join(state, "docker", "daemon-"+runner.DaemonName(m), id+".json"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the record of %s: %v, %v", id, fi, err)
		}
	}
	for _, dir := range []string{filepath.Join(state, "docker"), filepath.Join(state, "docker", "daemon-"+runner.DaemonName(m))} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("the records' directory %s: %v, %v", dir, fi, err)
		}
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerInspect(context.Background(), s.Info().Workspace, client.ContainerInspectOptions{}); err != nil {
		t.Fatalf("the session's container after Shutdown: %v", err)
	}
	// The daemon stopped an hour ago, as its heartbeat says: longer than
	// the dozing session's idle timeout.
	hour := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(state, "docker", "daemon-"+runner.DaemonName(m), "alive"), hour, hour); err != nil {
		t.Fatal(err)
	}

	again, _ := durableManager(t, state, runner.WithEndOnShutdown(true))
	defer again.Shutdown(context.Background())
	back, err := again.Get("acme", s.ID())
	if err != nil {
		t.Fatalf("the session after the restart: %v", err)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file after the restart: %q", got)
	}
	in, was := back.Info(), s.Info()
	if in.Workspace != was.Workspace || !in.Created.Equal(was.Created) || in.ExpiresAt == nil || !in.ExpiresAt.Equal(*was.ExpiresAt) {
		t.Fatalf("resumed as %+v, was %+v", in, was)
	}
	if _, err := again.Get("acme", dozing.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("the session idle past its timeout since the daemon stopped: %v", err)
	}
	if _, err := cli.ContainerInspect(context.Background(), dozing.Info().Workspace, client.ContainerInspectOptions{}); err == nil {
		t.Fatal("the idle session's container was left")
	}
	if _, err := again.Get("other", s.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("another tenant's Get of the resumed session: %v", err)
	}

	if err := again.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := containers(t, cli, map[string]string{backend.LabelDaemon: runner.DaemonName(m)}); len(left) != 0 {
		t.Fatalf("containers left after Shutdown with WithEndOnShutdown: %v", left)
	}
	if recs := records(t, state); len(recs) != 0 {
		t.Fatalf("records left after Shutdown with WithEndOnShutdown: %v", recs)
	}
}

// TestDockerCrashedSessionsAreResumed: the sessions of a manager that
// crashed (no Shutdown; its owner ended) are resumed by the next manager
// of its name, which the reaper leaves them to — but one whose container
// stopped meanwhile, and one whose uid another session holds, are removed
// with their records. Warm-pool containers are reaped: nothing is leaked.
func TestDockerCrashedSessionsAreResumed(t *testing.T) {
	self := backend.Self()
	if self.Start == "" {
		t.Skip("the kernel does not say when a process started (no /proc)")
	}
	state := t.TempDir()
	ended := backend.Owner{Host: self.Host, PID: self.PID, Start: "1"} // its PID now names a later process
	crashed, cli := durableManager(t, state, runner.WithLabels(ended.Labels()), runner.WithPool(runner.PoolConfig{Size: 1}))
	waitFor(t, func() bool { return crashed.Stats().Pools[0].Ready == 1 })
	daemon := runner.DaemonName(crashed)
	live := create(t, crashed, "acme", shell) // from the pool
	if br, res := bash(t, live, "echo kept > f"); br == nil || br.ExitCode != 0 {
		t.Fatal(res.Text)
	}
	stopped := create(t, crashed, "acme", shell)
	usurped := create(t, crashed, "acme", shell)
	br, res := bash(t, usurped, "id -u")
	if br == nil {
		t.Fatal(res.Text)
	}
	uid, err := strconv.Atoi(strings.TrimSpace(br.Output))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return crashed.Stats().Pools[0].Ready == 1 }) // left to the reaper
	runner.Crash(crashed)

	if _, err := cli.ContainerKill(context.Background(), stopped.Info().Workspace, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	if err := policy.HoldUID(uid); err != nil { // another session's now
		t.Fatal(err)
	}
	defer policy.ReleaseUID(uid)

	again, _ := durableManager(t, state)
	defer again.Shutdown(context.Background())
	back, err := again.Get("acme", live.ID())
	if err != nil {
		t.Fatalf("the session after the crash: %v", err)
	}
	if got := readFile(t, back, "f"); !strings.Contains(got, "kept") {
		t.Fatalf("its file after the crash: %q", got)
	}
	for _, s := range []*runner.Session{stopped, usurped} {
		if _, err := again.Get("acme", s.ID()); !errors.Is(err, runner.ErrNotFound) {
			t.Errorf("session %s after the crash: %v, want it removed", s.ID(), err)
		}
		if _, err := cli.ContainerInspect(context.Background(), s.Info().Workspace, client.ContainerInspectOptions{}); err == nil {
			t.Errorf("the container of the removed session %s was left", s.ID())
		}
	}
	if recs := records(t, state); len(recs) != 1 || recs[0] != live.ID() {
		t.Fatalf("records after the restart: %v, want only %s's", recs, live.ID())
	}
	// What is left of the daemon is the resumed session's container and
	// the new run's marker: the pool's waiting container was reaped.
	if left := containers(t, cli, map[string]string{backend.LabelDaemon: daemon}); len(left) != 2 {
		t.Fatalf("%d containers of the daemon after the restart, want the resumed session's and the marker", len(left))
	}
	if err := again.Delete(context.Background(), "acme", live.ID()); err != nil {
		t.Fatal(err)
	}
	if recs := records(t, state); len(recs) != 0 {
		t.Fatalf("records after the session's deletion: %v", recs)
	}
}

// TestDockerDetachedCallsAfterRestart: after a restart of the daemon the
// detached calls the earlier run accepted — one that had ended, one cut
// short by the stop — answer ErrInterrupted, not ErrNotFound, which an
// unknown call still answers; a background command ran on while no
// daemon was connected, and bash_output gives what it wrote meanwhile.
func TestDockerDetachedCallsAfterRestart(t *testing.T) {
	state := t.TempDir()
	m, cli := durableManager(t, state)
	defer m.Shutdown(context.Background())
	s := create(t, m, "acme", shell)
	ended, err := s.Detach(runner.DetachRequest{Tool: "bash", Args: json.RawMessage(`{"command":"echo done"}`)})
	if err != nil {
		t.Fatal(err)
	}
	<-ended.Done()
	running, err := s.Detach(runner.DetachRequest{Tool: "bash", Args: json.RawMessage(`{"command":"sleep 120","timeout":200}`)})
	if err != nil {
		t.Fatal(err)
	}
	bg, _ := toolCall[tools.BackgroundResult](t, s, "bash", map[string]any{"command": dockertest.Counting, "background": true})
	var before int
	for before < 3 { // it runs
		r, _ := toolCall[tools.BackgroundResult](t, s, "bash_output", map[string]any{"id": bg.ID, "wait": 0.5})
		before = max(before, dockertest.LastTick(r.Output))
	}

	// The stop gives calls in flight a second: the sleeping call is cut
	// short.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err = m.Shutdown(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	// The command counts on while no daemon runs.
	var meanwhile int
	deadline := time.Now().Add(time.Minute)
	for meanwhile <= before+3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // a poll of the engine, not a wait for it
		meanwhile = dockertest.Count(context.Background(), cli, s.Info().Workspace)
	}
	if meanwhile <= before+3 {
		t.Fatalf("the background command did not count on without the daemon: %d, %d before the stop", meanwhile, before)
	}

	again, _ := durableManager(t, state, runner.WithEndOnShutdown(true))
	defer again.Shutdown(context.Background())
	back, err := again.Get("acme", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*runner.Detached{ended, running} {
		if _, err := back.Detached(d.ID); !errors.Is(err, runner.ErrInterrupted) {
			t.Errorf("detached call %s after the restart: %v, want ErrInterrupted", d.ID, err)
		}
	}
	if _, err := back.Detached("call-0000000000000000"); !errors.Is(err, runner.ErrNotFound) {
		t.Errorf("an unknown detached call after the restart: %v, want ErrNotFound", err)
	}
	r, _ := toolCall[tools.BackgroundResult](t, back, "bash_output", map[string]any{"id": bg.ID, "wait": 0.5})
	if !r.Running || !strings.Contains(r.Output, "tick "+strconv.Itoa(meanwhile)+"\n") {
		t.Fatalf("bash_output after the restart: running %v, output %q; want tick %d, written while no daemon ran", r.Running, r.Output, meanwhile)
	}
	k, _ := toolCall[tools.BackgroundResult](t, back, "bash_kill", map[string]any{"id": bg.ID})
	if k.Running || !k.Killed {
		t.Fatalf("bash_kill after the restart: %+v", k)
	}
}

// TestDockerEgressAfterRestart: a resumed session's egress proxy comes
// back before its first call, on the handoff and on the stream alike,
// after a stop and after a crash (whose handoff socket is left behind).
func TestDockerEgressAfterRestart(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "through the proxy") }))
	defer web.Close()
	u, _ := url.Parse(web.URL)
	dest := "plain.test:" + u.Port()
	opts := []runner.Option{runner.WithEgress(egress.Policy{Allow: []string{dest}, AllowPrivate: []string{"127.0.0.1"}},
		egress.WithResolver(names{"plain.test": "127.0.0.1"}))}
	fetch := func(t *testing.T, s *runner.Session) {
		t.Helper()
		if br, res := bash(t, s, "wget -qO- http://"+dest+"/"); br == nil || br.Output != "through the proxy" {
			t.Fatalf("a request through the proxy: %s", res.Text)
		}
	}
	for _, tc := range []struct {
		name    string
		handoff bool
		crash   bool
	}{
		{"handoff, stop", true, false},
		{"handoff, crash", true, true},
		{"stream, stop", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, dir := t.TempDir(), ""
			if tc.handoff {
				dir = handoffDir(t)
			}
			first := opts
			if tc.crash {
				ended := backend.Owner{Host: backend.Self().Host, PID: backend.Self().PID, Start: "1"}
				first = append(slices.Clone(opts), runner.WithLabels(ended.Labels()))
			}
			m, _ := dockerManagerOn(t, &docker.Backend{StateDir: state, HandoffDir: dir}, first...)
			defer m.Shutdown(context.Background())
			s := create(t, m, "acme", shell)
			fetch(t, s)
			if tc.crash {
				runner.Crash(m)
				staleSockets(t, dir)
			} else if err := m.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			again, _ := dockerManagerOn(t, &docker.Backend{StateDir: state, HandoffDir: dir}, append(slices.Clone(opts), runner.WithEndOnShutdown(true))...)
			defer again.Shutdown(context.Background())
			back, err := again.Get("acme", s.ID())
			if err != nil {
				t.Fatal(err)
			}
			fetch(t, back)
		})
	}
}

// staleSockets leaves in each container's handoff directory under dir the
// socket a killed daemon would have left: bound, no longer listening.
func staleSockets(t *testing.T, dir string) {
	t.Helper()
	hs, _ := filepath.Glob(filepath.Join(dir, "h-*"))
	for _, h := range hs {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(h, "s"), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	if len(hs) == 0 {
		t.Fatal("no handoff directory: the test proves nothing")
	}
}
