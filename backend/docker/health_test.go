package docker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestPausedContainerIsNotKilled: a command past its deadline in a paused
// container (docker pause, as docker commit pauses) fails as Unavailable,
// saying the container is paused, and the hang watchdog leaves the
// container alone: once unpaused it serves the next command.
func TestPausedContainerIsNotKilled(t *testing.T) {
	ctx := context.Background()
	ctr := dockertest.Start(t, docker.Spec{AgentOptions: []agent.ClientOption{agent.WithHangGrace(2 * time.Second)}})
	cli := dockertest.Client(t)
	if _, err := cli.ContainerPause(ctx, ctr.ID(), client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	paused := true
	t.Cleanup(func() {
		if paused {
			cli.ContainerUnpause(ctx, ctr.ID(), client.ContainerUnpauseOptions{})
		}
	})
	_, err := ctr.Bash().Run(ctx, workspace.Command{Script: "echo late", Timeout: time.Second})
	if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "is paused") {
		t.Fatalf("a command in a paused container: %v; want Unavailable, saying it is paused", err)
	}
	if _, err := cli.ContainerUnpause(ctx, ctr.ID(), client.ContainerUnpauseOptions{}); err != nil {
		t.Fatal(err)
	}
	paused = false
	res, err := ctr.Bash().Run(ctx, workspace.Command{Script: "exit 3", Timeout: time.Minute})
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("a command once unpaused: %+v, %v (the container was killed?)", res, err)
	}
}

// TestFrozenEngineIsNotTakenForAHungAgent: behind an engine that holds
// everything unanswered (a SIGSTOPped dockerd, which carries the agent's
// stream), a command past its deadline fails as Unavailable, saying the
// engine does not answer, and the container is not killed: once the
// engine answers it serves the next command.
func TestFrozenEngineIsNotTakenForAHungAgent(t *testing.T) {
	ctx := context.Background()
	p := dockertest.NewProxy(t)
	ctr, err := docker.Start(ctx, p.Client(t), dockertest.Spec(t, docker.Spec{AgentOptions: []agent.ClientOption{agent.WithHangGrace(2 * time.Second)}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctr.Close(ctx) })
	p.Stall()
	_, err = ctr.Bash().Run(ctx, workspace.Command{Script: "echo late", Timeout: time.Second})
	if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("a command behind a frozen engine: %v; want Unavailable, saying the engine does not answer", err)
	}
	p.Up()
	res, err := ctr.Bash().Run(ctx, workspace.Command{Script: "exit 3", Timeout: time.Minute})
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("a command once the engine answers: %+v, %v (the container was killed?)", res, err)
	}
}
