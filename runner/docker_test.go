package runner_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

func TestMain(m *testing.M) { dockertest.Main(m, "runner") }

func dockerManager(t testing.TB, opts ...runner.Option) (*runner.Manager, *client.Client) {
	t.Helper()
	return dockerManagerOn(t, &docker.Backend{}, opts...)
}

// dockerManagerOn is dockerManager on b, its Client and Agent filled in.
func dockerManagerOn(t testing.TB, b *docker.Backend, opts ...runner.Option) (*runner.Manager, *client.Client) {
	t.Helper()
	cli := dockertest.Client(t)
	agent, err := agentbin.Path()
	if err != nil {
		t.Fatal(err)
	}
	if b.Client == nil {
		b.Client = cli
	}
	b.Agent = agent
	// A name of the test's own, unless it gives one: a daemon's name
	// claims a marker container on the shared engine.
	opts = append([]runner.Option{
		runner.WithDaemonName(dockertest.DaemonName("runner-" + strings.ToLower(strings.NewReplacer("/", "-", "#", "-").Replace(t.Name())))),
		runner.WithLabels(dockertest.Labels()),
		runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dockertest.Image(t)})),
	}, opts...)
	m, err := runner.New(context.Background(), b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, cli
}

// containers lists the containers carrying the test's labels and labels.
func containers(t *testing.T, cli *client.Client, labels map[string]string) []string {
	t.Helper()
	f := make(client.Filters)
	for k, v := range dockertest.Labels() {
		f.Add("label", k+"="+v)
	}
	for k, v := range labels {
		f.Add("label", k+"="+v)
	}
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range list.Items {
		names = append(names, c.ID)
	}
	return names
}

func bash(t *testing.T, s *runner.Session, script string) (*tools.BashResult, tools.Result) {
	t.Helper()
	return bashFor(t, s, script, 20)
}

// bashFor is bash with a timeout of seconds.
func bashFor(t *testing.T, s *runner.Session, script string, seconds int) (*tools.BashResult, tools.Result) {
	t.Helper()
	args, _ := json.Marshal(map[string]any{"command": script, "timeout": seconds})
	res, err := s.Call(context.Background(), "bash", args, tools.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	br, _ := res.Structured.(*tools.BashResult)
	return br, res
}

func TestDockerSessions(t *testing.T) {
	daemon := dockertest.DaemonName("runner-test")
	m, cli := dockerManager(t, runner.WithPool(runner.PoolConfig{Size: 1}), runner.WithDaemonName(daemon))
	defer m.Shutdown(context.Background())
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })

	s := create(t, m, "acme", shell)
	if !s.Info().Pooled || s.Root() != "/workspace" {
		t.Fatalf("session %+v", s.Info())
	}
	br, res := bash(t, s, "id -u; pwd; echo $SANDBOXD_SESSION_ID; echo hi > f")
	if br == nil || !strings.HasSuffix(br.Output, "\n/workspace\n\n") || !policy.DefaultSessionUIDs.Contains(first(strconv.Atoi(strings.Fields(br.Output)[0]))) {
		t.Fatalf("bash in the container: %q", res.Text)
	}
	if r, _ := s.Call(context.Background(), "read", json.RawMessage(`{"path":"f"}`), tools.CallOptions{}); r.IsError {
		t.Fatal(r.Text)
	}

	// A container killed from outside ends its session, which says why.
	cold := create(t, m, "acme", shell)
	if _, err := cli.ContainerKill(context.Background(), cold.Info().Workspace, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cold.Done():
	case <-time.After(time.Minute):
		t.Fatal("the session outlived its killed container")
	}
	_, err := cold.Call(context.Background(), "bash", json.RawMessage(`{"command":"echo never"}`), tools.CallOptions{})
	if !errors.Is(err, runner.ErrWorkspaceEnded) || !strings.Contains(err.Error(), "exit code 137") {
		t.Fatalf("call in a killed container: %v", err)
	}
	if _, err := m.Get("acme", cold.ID()); !errors.Is(err, runner.ErrWorkspaceEnded) {
		t.Fatalf("Get of the session whose container was killed: %v", err)
	}
	if got := m.Stats().Lost; got != 1 {
		t.Fatalf("Stats().Lost = %d, want 1", got)
	}

	// A pooled container killed while it waits is never handed out.
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })
	f := make(client.Filters).Add("label", backend.LabelDaemon+"="+daemon).Add("name", "sandboxd-warm-")
	pooled, err := cli.ContainerList(context.Background(), client.ContainerListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	waiting := slices.DeleteFunc(pooled.Items, func(c container.Summary) bool { return slices.Contains(c.Names, "/"+s.Info().Workspace) })
	if len(waiting) != 1 {
		t.Fatalf("%d pooled containers waiting, want 1", len(waiting))
	}
	if _, err := cli.ContainerKill(context.Background(), waiting[0].ID, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	again := create(t, m, "acme", shell)
	if br, res := bash(t, again, "echo ok"); br == nil || br.Output != "ok\n" {
		t.Fatalf("a session after its pooled container was killed: %s", res.Text)
	}

	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := containers(t, cli, map[string]string{backend.LabelDaemon: daemon}); len(left) != 0 {
		t.Fatalf("containers left after Shutdown: %v", left)
	}
}

// TestDockerReapAfterCrash: a manager that never shut down leaves its
// containers (its session's and its marker); while its owner lives, a second
// manager of the same daemon refuses to start, naming it, and touches
// nothing; once the owner has ended — here, its PID reused by a process
// that started later — the next manager of the daemon removes them at start.
func TestDockerReapAfterCrash(t *testing.T) {
	self := backend.Self()
	if self.Start == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("the kernel does not say when a process started (no /proc), which CI's Linux must")
		}
		t.Skip("the kernel does not say when a process started (no /proc)")
	}
	name := dockertest.DaemonName("crashy-" + strings.ToLower(rand.Text()[:8]))
	crashed, cli := dockerManager(t, runner.WithDaemonName(name))
	defer crashed.Shutdown(context.Background())
	create(t, crashed, "acme", runner.Settings{})
	if n := len(containers(t, cli, map[string]string{backend.LabelDaemon: name})); n != 2 {
		t.Fatalf("%d containers before the restart, want the session's and the marker", n)
	}
	_, err := runner.New(context.Background(), crashed.Backend(), runner.WithLabels(dockertest.Labels()),
		runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dockertest.Image(t)})), runner.WithDaemonName(name))
	if !errors.Is(err, backend.ErrDaemonRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", self.PID)) {
		t.Fatalf("a second run of a living daemon: %v", err)
	}
	if n := len(containers(t, cli, map[string]string{backend.LabelDaemon: name})); n != 2 {
		t.Fatal("a refused run touched the living run's containers")
	}
	other, _ := dockerManager(t, runner.WithDaemonName(name+"-else"))
	defer other.Shutdown(context.Background())
	if n := len(containers(t, cli, map[string]string{backend.LabelDaemon: name})); n != 2 {
		t.Fatal("another daemon reaped crashy's container")
	}

	// A run on another host sharing the engine cannot be judged from here:
	// it is refused too, and the error says how to free the name.
	remote, _ := dockerManager(t, runner.WithDaemonName(name+"-remote"), runner.WithLabels(backend.Owner{Host: "elsewhere/boot", PID: 1}.Labels()))
	defer remote.Shutdown(context.Background())
	_, err = runner.New(context.Background(), crashed.Backend(), runner.WithLabels(dockertest.Labels()),
		runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dockertest.Image(t)})), runner.WithDaemonName(name+"-remote"))
	if !errors.Is(err, backend.ErrDaemonRunning) || !strings.Contains(err.Error(), "host elsewhere") || !strings.Contains(err.Error(), "docker rm sandboxd-daemon-"+name+"-remote") {
		t.Fatalf("a second run of a daemon living on another host: %v", err)
	}

	// The crashed run's owner ends: its PID now names a later process.
	ended := backend.Owner{Host: self.Host, PID: self.PID, Start: "1"}
	dead, _ := dockerManager(t, runner.WithDaemonName(name+"-ended"), runner.WithLabels(ended.Labels()))
	create(t, dead, "acme", runner.Settings{})
	restarted, _ := dockerManager(t, runner.WithDaemonName(name+"-ended"))
	defer restarted.Shutdown(context.Background())
	if left := containers(t, cli, map[string]string{backend.LabelDaemon: name + "-ended", backend.LabelOwnerStart: "1"}); len(left) != 0 {
		t.Fatalf("containers of the crashed run left: %v", left)
	}
	s := create(t, restarted, "acme", shell)
	if br, res := bash(t, s, "echo ok"); br == nil || br.Output != "ok\n" {
		t.Fatal(res.Text)
	}
}

// BenchmarkDockerFirstCall measures a session's creation up to the end of
// its first tool call, with the container claimed from a warm pool and
// started cold, in the same run. It reports the median.
func BenchmarkDockerFirstCall(b *testing.B) {
	for _, tc := range []struct {
		name string
		pool int
	}{{"pooled", 2}, {"cold", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			var opts []runner.Option
			if tc.pool > 0 {
				opts = append(opts, runner.WithPool(runner.PoolConfig{Size: tc.pool}))
			}
			m, _ := dockerManager(b, opts...)
			defer m.Shutdown(context.Background())
			var took []time.Duration
			for b.Loop() {
				b.StopTimer()
				if tc.pool > 0 {
					waitFor(b, func() bool { return m.Stats().Pools[0].Ready > 0 })
				}
				b.StartTimer()
				begin := time.Now()
				s := create(b, m, "acme", runner.Settings{})
				if res, err := s.Call(context.Background(), "ls", nil, tools.CallOptions{}); err != nil || res.IsError {
					b.Fatal(err, res.Text)
				}
				took = append(took, time.Since(begin))
				if s.Info().Pooled != (tc.pool > 0) {
					b.Fatalf("pooled = %v", s.Info().Pooled)
				}
				b.StopTimer()
				m.Delete(context.Background(), "acme", s.ID())
				b.StartTimer()
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms")
		})
	}
}

func first(n int, _ error) int { return n }
