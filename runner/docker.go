package runner

import (
	"context"
	"fmt"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/dockerfs"
	"github.com/sandboxd/sandboxd/policy"
)

// Docker is the backend of hardened session containers: one container per
// session, made from the session's profile (package dockerexec), its files
// and commands served by the sandboxd agent running as the container's
// PID 1 (packages dockerfs and dockerexec). A container killed from outside
// makes the session's calls fail with workspace.ErrUnavailable at once.
type Docker struct {
	// Client talks to the engine. Required.
	Client client.APIClient
	// Agent is the sandboxd-agent binary; "" finds it (dockerexec.FindAgent).
	Agent string
	// MaxWorkspaceBytes caps the initial copy of a session's Source, sparse
	// files counted at their full size; 0 is
	// dockerexec.DefaultMaxWorkspaceBytes.
	MaxWorkspaceBytes int64
}

var _ Warmer = (*Docker)(nil)

// Name returns "docker".
func (*Docker) Name() string { return "docker" }

// Open starts the session's container, named and labelled after it, its
// workspace filled with a copy of spec.Source when set.
func (d *Docker) Open(ctx context.Context, spec Spec) (*Instance, error) {
	return d.start(ctx, spec, spec.Profile)
}

// Warm starts a container for a pool: named after a pool ID, labelled as
// the daemon's, and handed to a session as it is. The session's ID and
// variables reach its commands through the tool layer.
func (d *Docker) Warm(ctx context.Context, spec Spec) (*Instance, error) {
	prof := spec.Profile
	prof.Session = randomID("warm-")
	spec.Source = ""
	return d.start(ctx, spec, prof)
}

func (d *Docker) start(ctx context.Context, spec Spec, prof policy.Profile) (*Instance, error) {
	c, err := dockerexec.Start(ctx, d.Client, dockerexec.Spec{Profile: prof, Labels: spec.Labels, Agent: d.Agent, WorkspaceDir: spec.Source, MaxWorkspaceBytes: d.MaxWorkspaceBytes})
	if err != nil {
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	return &Instance{FS: dockerfs.New(c), Bash: c.Bash(), Root: policy.WorkspaceDir, ID: c.Name(), Close: c.Close}, nil
}

// Reap removes every container and volume carrying labels: those of an
// earlier run of the same daemon.
func (d *Docker) Reap(ctx context.Context, labels map[string]string) (int, error) {
	return dockerexec.Reap(ctx, d.Client, labels)
}
