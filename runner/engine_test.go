package runner_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// proxiedManager is a Docker manager whose backend reaches the engine
// through a dockertest.Proxy, and the daemon's name.
func proxiedManager(t *testing.T, name string) (*runner.Manager, *dockertest.Proxy, string) {
	t.Helper()
	p := dockertest.NewProxy(t)
	daemon := dockertest.DaemonName(name)
	m, _ := dockerManagerOn(t, &docker.Backend{Client: p.Client(t)}, runner.WithDaemonName(daemon))
	return m, p, daemon
}

// leftovers lists what the engine holds of daemon.
func leftovers(t *testing.T, daemon string) []string {
	t.Helper()
	return dockertest.Leftovers(t, make(client.Filters).Add("label", backend.LabelDaemon+"="+daemon))
}

// until waits, up to bound, for cond; a bound only turns a hang into a
// failure.
func until(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isDelete(r *http.Request) bool { return r.Method == http.MethodDelete }

// TestFlakyEngineLeavesNothing: while the engine refuses every removal
// (a 500 on each DELETE), deleted sessions, a lost one and a shutdown's
// leave their containers and volumes queued, each failure counted; once
// the engine answers again the queue removes them all, Shutdown waits for
// it, and nothing of the daemon is left on the engine.
func TestFlakyEngineLeavesNothing(t *testing.T) {
	m, p, daemon := proxiedManager(t, "flaky")
	var sessions []*runner.Session
	for range 3 {
		sessions = append(sessions, create(t, m, "acme", shell))
	}
	p.Fail(http.StatusInternalServerError, isDelete)
	for _, s := range sessions[:2] {
		if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
			t.Fatalf("Delete while the engine refuses removals: %v (the removal is queued, not failed)", err)
		}
	}
	until(t, 2*time.Minute, "both removals queued, and retried", func() bool {
		st := m.Stats().Removals
		return st.Pending == 2 && st.Failed >= 4
	})
	// A session whose container dies while removals fail.
	lost := create(t, m, "acme", shell)
	queued := m.Stats().Removals.Pending // 2, and a loader's the create left, perhaps
	if _, err := dockertest.Client(t).ContainerKill(context.Background(), lost.Info().Workspace, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	until(t, 2*time.Minute, "the lost session's removal queued", func() bool { return m.Stats().Removals.Pending == queued+1 })

	stopped := make(chan error, 1)
	go func() { stopped <- m.Shutdown(context.Background()) }()
	until(t, 2*time.Minute, "the last session's removal queued at shutdown", func() bool { return m.Stats().Removals.Pending == queued+2 })
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned while removals were pending: %v", err)
	default:
	}
	p.Up()
	select {
	case err := <-stopped:
		// The marker's removal failed while DELETEs did, or not; the
		// workspaces are what must not leak.
		if err != nil && !strings.Contains(err.Error(), "marker") {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("Shutdown did not return once the engine answered")
	}
	if st := m.Stats().Removals; st.Pending != 0 {
		t.Fatalf("after Shutdown, %d removals pending", st.Pending)
	}
	for _, l := range leftovers(t, daemon) {
		if !strings.Contains(l, "sandboxd-daemon-") {
			t.Errorf("left on the engine: %s", l)
		}
	}
}

// TestEngineDown: with the engine gone (its socket removed), a create
// fails as unreachable — Unavailable, never NotFound — and leaves nothing
// once the engine is back.
func TestEngineDown(t *testing.T) {
	m, p, daemon := proxiedManager(t, "down")
	p.Down()
	_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: shell})
	if !errors.Is(err, backend.ErrUnreachable) || workspace.KindOf(err) != workspace.ErrUnavailable {
		t.Fatalf("create with the engine down: %v (kind %v), want ErrUnreachable, Unavailable", err, workspace.KindOf(err))
	}
	if err := m.Backend().(backend.Checker).Check(context.Background()); !errors.Is(err, backend.ErrUnreachable) {
		t.Fatalf("Check with the engine down: %v", err)
	}
	p.Up()
	if err := m.Backend().(backend.Checker).Check(context.Background()); err != nil {
		t.Fatalf("Check with the engine up: %v", err)
	}
	s := create(t, m, "acme", shell)
	if br, res := bash(t, s, "echo ok"); br == nil || br.Output != "ok\n" {
		t.Fatalf("a session once the engine is back: %s", res.Text)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, daemon); len(left) != 0 {
		t.Fatalf("left on the engine: %v", left)
	}
}

// TestEngineFrozen: an engine that holds every request unanswered (a
// SIGSTOPped dockerd) fails a create as unreachable, within its pings'
// bound, instead of hanging; what the create had made is removed once
// the engine answers again.
func TestEngineFrozen(t *testing.T) {
	m, p, daemon := proxiedManager(t, "frozen")
	p.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang, not a slow engine, fails this
	defer cancel()
	_, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: shell})
	if ctx.Err() != nil {
		t.Fatal("the create waited on the frozen engine")
	}
	if !errors.Is(err, backend.ErrUnreachable) || workspace.KindOf(err) != workspace.ErrUnavailable {
		t.Fatalf("create on a frozen engine: %v, want ErrUnreachable", err)
	}
	p.Up()
	if err := m.Shutdown(context.Background()); err != nil && !strings.Contains(err.Error(), "marker") {
		t.Fatal(err)
	}
	if left := leftovers(t, daemon); len(left) != 0 {
		t.Fatalf("left on the engine: %v", left)
	}
}

// TestEngineRestartLeavesNothing: the engine goes away under a session —
// its stream cut, its container killed, as an engine restart without
// live-restore does — so the session is lost while its removal cannot
// reach the engine; once the engine is back the queued removal takes the
// container and volume, and Shutdown waits for it (integration's
// TestServeOnFreshEngine once found a container left after SIGTERM).
func TestEngineRestartLeavesNothing(t *testing.T) {
	m, p, daemon := proxiedManager(t, "restart")
	s := create(t, m, "acme", shell)
	p.Down()
	if _, err := dockertest.Client(t).ContainerKill(context.Background(), s.Info().Workspace, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	until(t, 2*time.Minute, "the session lost, its removal queued", func() bool {
		st := m.Stats()
		return st.Lost == 1 && st.Removals.Pending >= 1 && st.Removals.Failed >= 1
	})
	p.Up()
	if err := m.Shutdown(context.Background()); err != nil && !strings.Contains(err.Error(), "marker") {
		t.Fatal(err)
	}
	if left := leftovers(t, daemon); len(left) != 0 {
		t.Fatalf("left on the engine: %v", left)
	}
}
