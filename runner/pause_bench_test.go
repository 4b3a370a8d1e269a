package runner_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// BenchmarkDockerPause measures, on the Docker backend, a session's pause
// and its resume to its first call (a read), PAUSE_BENCH_ROUNDS times
// (default 5) each, beside the floors of the same run: docker stop -t 0
// and docker start of a container of the same image. It reports each
// step's median and slowest. Run it with -benchtime 1x.
func BenchmarkDockerPause(b *testing.B) {
	rounds := envInt("PAUSE_BENCH_ROUNDS", 5)
	m, cli := dockerManagerOn(b, &docker.Backend{StateDir: b.TempDir()})
	defer m.Shutdown(context.Background())
	ctx := context.Background()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: shell})
	if err != nil {
		b.Fatal(err)
	}
	if res, err := s.Call(ctx, "bash", json.RawMessage(`{"command":"echo kept > f"}`), tools.CallOptions{}); err != nil || res.IsError {
		b.Fatal(err, res.Text)
	}
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: dockertest.Image(b), Cmd: []string{"sleep", "100000"}, Labels: dockertest.Labels()},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
	if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		b.Fatal(err)
	}
	steps := map[string][]time.Duration{}
	timed := func(name string, fn func() error) {
		start := time.Now()
		if err := fn(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		steps[name] = append(steps[name], time.Since(start))
	}
	zero := 0
	b.ResetTimer()
	for range rounds {
		timed("pause", func() error { _, err := m.Pause(ctx, "acme", s.ID()); return err })
		timed("resume-to-first-call", func() error {
			back, err := m.Resume(ctx, "acme", s.ID())
			if err != nil {
				return err
			}
			res, err := back.Call(ctx, "read", json.RawMessage(`{"path":"f"}`), tools.CallOptions{})
			if err == nil && res.IsError {
				b.Fatal(res.Text)
			}
			return err
		})
		timed("floor-docker-stop-t0", func() error {
			_, err := cli.ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &zero})
			return err
		})
		timed("floor-docker-start", func() error {
			_, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{})
			return err
		})
	}
	b.StopTimer()
	for _, name := range []string{"pause", "resume-to-first-call", "floor-docker-stop-t0", "floor-docker-start"} {
		d := slices.Sorted(slices.Values(steps[name]))
		b.Logf("%-22s median %v, slowest %v (%d rounds)", name, d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond), len(d))
		b.ReportMetric(float64(d[len(d)/2].Milliseconds()), name+"-ms")
	}
	b.Logf("load average %s", loadAvg())
}
