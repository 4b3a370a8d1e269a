package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
)

// Engine health bounds: while a container starts, the engine is pinged
// every pingEvery; one that leaves a ping unanswered for frozenAfter (a
// dockerd SIGSTOPped, say) is taken for unreachable, and the start fails
// instead of hanging.
const (
	pingEvery   = 5 * time.Second
	frozenAfter = 10 * time.Second
)

// pinger is an Engine that can be pinged (*client.Client).
type pinger interface {
	Ping(ctx context.Context, options client.PingOptions) (client.PingResult, error)
}

// Check pings the engine ([backend.Checker]): nil when it answers within
// ctx and frozenAfter, else an error wrapping [backend.ErrUnreachable]
// naming the engine's address.
func (d *Backend) Check(ctx context.Context) error { return check(ctx, d.Client) }

func check(ctx context.Context, cli Engine) error {
	ctx, cancel := context.WithTimeout(ctx, frozenAfter)
	defer cancel()
	var err error
	if p, ok := cli.(pinger); ok {
		_, err = p.Ping(ctx, client.PingOptions{})
	} else {
		_, err = cli.ContainerList(ctx, client.ContainerListOptions{Limit: 1})
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no answer within %v", frozenAfter)
	}
	return unreachable(cli, err)
}

// unreachable is the error of an engine that does not answer: it wraps
// backend.ErrUnreachable, and keeps why only as words, so that a kind the
// cause carries (NotFound, for a socket that is gone) does not pass for
// the request's.
func unreachable(cli Engine, why error) error {
	return fmt.Errorf("%w (%s): %v; retry once it is back", backend.ErrUnreachable, cli.DaemonHost(), why)
}

// watchEngine returns ctx, to be ended by stop, which also ends — its
// cause an error wrapping backend.ErrUnreachable — once the engine leaves
// a ping unanswered for frozenAfter or refuses one; the engine is pinged
// every pingEvery.
func watchEngine(ctx context.Context, cli Engine) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	quit := make(chan struct{})
	go func() {
		t := time.NewTicker(pingEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := check(ctx, cli); err != nil && ctx.Err() == nil {
				cancel(err)
				return
			}
		}
	}()
	return ctx, func() { close(quit); cancel(nil) }
}

// stalled tells why the agent of c may not answer although it is not
// hung, for agent.WithStall: the container is paused (docker pause, or
// docker commit, which pauses), or the engine, which carries the agent's
// stream, does not answer. "" means neither: the agent is hung.
func (c *Container) stalled() string {
	ctx, cancel := context.WithTimeout(context.Background(), frozenAfter)
	defer cancel()
	res, err := c.cli.ContainerInspect(ctx, c.id, client.ContainerInspectOptions{})
	switch {
	case err != nil && cerrdefs.IsNotFound(err):
		return ""
	case err != nil:
		return unreachable(c.cli, err).Error()
	case res.Container.State != nil && res.Container.State.Paused:
		return fmt.Sprintf("container %s is paused (docker pause or docker commit); it is left as it is, and answers once unpaused", c.name)
	}
	return ""
}
