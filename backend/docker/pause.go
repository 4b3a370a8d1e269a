package docker

import (
	"context"
	"errors"
	"fmt"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
)

// Pausing a session (Instance.Pause) stops its container — `docker stop`,
// not `docker pause`, which freezes the processes but keeps their memory:
// a stopped container holds no process, so no CPU and no memory, while
// its workspace volume, its handoff directory and its session uid are
// kept. Resuming starts the same container again: a fresh agent as its
// PID 1, the workspace as it was. What lived in the container's memory
// does not survive: processes, background commands, /tmp (a tmpfs).

// pause is the Instance.Pause of c, its record kept by r.
func (d *Backend) pause(c *Container, r *recorder) func(ctx context.Context) (*backend.Paused, error) {
	return func(ctx context.Context) (*backend.Paused, error) {
		// The record says paused before the container stops, so that a
		// daemon that dies meanwhile finds the container kept, not gone.
		if err := r.setPaused(true); err != nil {
			return nil, err
		}
		c.dropStream()
		if err := c.stop(ctx); err != nil {
			// The container may run on, or have stopped: its Resume looks.
			p := d.paused(c, r)
			p.Resume = func(ctx context.Context) (*backend.Instance, error) { return d.unpause(ctx, c, r, true) }
			return p, fmt.Errorf("docker backend: pausing: %w", err)
		}
		return d.paused(c, r), nil
	}
}

// stop stops the container at once: the agent, PID 1, ignores SIGTERM, so
// nothing is gained by waiting for it; the calls and background commands
// it served were ended before.
func (c *Container) stop(ctx context.Context) error {
	now := 0
	_, err := c.cli.ContainerStop(ctx, c.id, client.ContainerStopOptions{Timeout: &now})
	if err != nil && !cerrdefs.IsNotModified(err) {
		return fmt.Errorf("stopping the container %s: %w", c.name, err)
	}
	return nil
}

// paused is the backend.Paused of c, stopped, its record kept by r.
func (d *Backend) paused(c *Container, r *recorder) *backend.Paused {
	p := &backend.Paused{
		ID: c.name, Root: policy.WorkspaceDir,
		Resume: func(ctx context.Context) (*backend.Instance, error) { return d.unpause(ctx, c, r, false) },
		Close: func(ctx context.Context) error {
			if err := c.removeCtx(ctx); err != nil {
				d.queue().add(c.Name(), c.removeCtx, err)
			}
			return r.drop()
		},
	}
	if r.dir != "" {
		p.Leave = func(context.Context) error {
			if c.uid != 0 {
				c.release.Do(func() { policy.LeaveUID(c.uid) })
			}
			return nil
		}
	}
	return p
}

// unpause starts the stopped container of a paused session again and
// returns its instance; on failure it is stopped again, still paused.
// With look — after a stop that failed — it first asks the engine whether
// the container still runs, and then attaches to its agent again
// (resync: the agent ends what the dropped stream left) rather than
// start it.
func (d *Backend) unpause(ctx context.Context, old *Container, r *recorder, look bool) (*backend.Instance, error) {
	c := &Container{
		cli: old.cli, id: old.id, name: old.name, volume: old.volume, uid: old.uid,
		owner: old.owner, maxBytes: old.maxBytes, q: old.q, handoffDir: old.handoffDir, disk: old.disk,
		stderr: old.stderr, agentOpts: old.agentOpts,
	}
	wctx, stop := watchEngine(ctx, d.Client)
	defer stop()
	start := func() error {
		if c.disk != "" {
			// Its loop device is gone when the host restarted meanwhile.
			if err := attachDisk(wctx, c.disk); err != nil {
				return err
			}
		}
		_, err := c.cli.ContainerStart(wctx, c.id, client.ContainerStartOptions{})
		return err
	}
	var err error
	if look {
		var res client.ContainerInspectResult
		if res, err = c.cli.ContainerInspect(wctx, c.id, client.ContainerInspectOptions{}); err == nil {
			if st := res.Container.State; st != nil && st.Running && !st.Paused {
				start = nil
			}
		}
	}
	if err == nil {
		err = c.connect(wctx, start)
	}
	if err == nil {
		r.mu.Lock()
		r.c = c
		r.mu.Unlock()
		if err = r.setPaused(false); err != nil {
			c.dropStream()
		}
	}
	if err != nil {
		if cause := context.Cause(wctx); ctx.Err() == nil && errors.Is(cause, backend.ErrUnreachable) {
			err = cause
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), frozenAfter) // an engine that froze is not waited for
		defer cancel()
		return nil, errors.Join(fmt.Errorf("docker backend: resuming %s: %w", c.name, err), c.stop(sctx))
	}
	return d.instance(c, r), nil
}
