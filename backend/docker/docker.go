// Package docker is the [backend.Backend] of hardened session containers,
// the one a daemon of many tenants runs. [Start] creates a container from a
// [policy.Profile], puts the sandboxd agent and the initial workspace into
// it before it starts, runs the agent as its PID 1 and talks to it over the
// container's attached standard input and output; the agent's client
// ([Container.Agent]) is the workspace's [workspace.FileSystem] and [Bash]
// its [workspace.Bash], over that one stream. [Backend] opens a session's
// container from its [backend.Spec]; it is a [backend.Warmer] (containers
// may wait in a warm pool), a [backend.Claimer] (daemons sharing an
// engine claim their name with a marker container), a [backend.Checker]
// (Check pings the engine) and a [backend.Remover]: a container or volume
// the engine refuses to remove (down, slow, a 5xx) is retried in the
// background, with backoff from 250 ms to 15 s, until it is gone.
//
// Engine trouble is told apart from the agent's: while a container
// starts the engine is pinged every 5 s, and one that leaves a ping
// unanswered for 10 s, or refuses it, fails the start with an error
// wrapping [backend.ErrUnreachable]; an agent that misses its deadline in
// a container that is paused, or behind an engine that does not answer,
// fails that call as Unavailable and is not killed (agent.WithStall).
//
//	c, err := docker.Start(ctx, cli, docker.Spec{Profile: prof, WorkspaceDir: dir})
//	defer c.Close(context.Background())
//	res, err := c.Bash().Run(ctx, workspace.Command{Script: "make test"})
//	data, err := c.Agent().ReadFile(ctx, "go.mod", 1<<20)
//
// Tool calls go through the agent's one long-lived stream and never through
// docker exec or the archive API; a file call costs one round trip on the
// open stream, well under a millisecond. The calls are carried out in the
// container on /workspace with the agent's traversal-resistant confinement
// (links are followed only inside the workspace, resolution and use are one
// step). The archive API is used only while no code runs in the container:
// before it starts, to put the agent and the initial workspace in.
// Everything the agent answers is treated as untrusted by the agent client:
// sizes are bounded, names checked, and a garbled stream makes the
// workspace unavailable ([workspace.ErrUnavailable]), never panics.
package docker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/images/engine"
	"github.com/sandboxd/sandboxd/policy"
)

// Backend is the backend of hardened session containers: one container per
// session, made from the session's profile ([Start]), its files and
// commands served by the sandboxd agent running as the container's PID 1. A container killed from outside
// ends its workspace (Instance.Done, Err naming the container's exit code)
// at once.
type Backend struct {
	// Client talks to the engine. Required.
	Client Engine
	// Agent is the sandboxd-agent binary; "" finds it (FindAgent).
	Agent string
	// MaxWorkspaceBytes caps the initial copy of a session's Source, sparse
	// files counted at their full size; 0 is
	// DefaultMaxWorkspaceBytes.
	MaxWorkspaceBytes int64
	// HandoffDir is where each container gets a directory through which
	// its egress connections reach the daemon without crossing the attach
	// stream (Spec.HandoffDir); "" carries them on the stream.
	HandoffDir string
	// Logger receives the failures of removals the backend retries; nil
	// is slog.Default().
	Logger *slog.Logger
	// StateDir, when set, keeps each session's record
	// (STATEDIR/docker/daemon-NAME/SESSION.json), so that its container
	// outlives the daemon's run: a run that stops leaves it running
	// (Instance.Leave), and the daemon's next run resumes it (Resume). ""
	// keeps none: every container ends with the run that made it.
	StateDir string
	// DiskBytes, when above zero, gives each session's workspace a file
	// system of its own of that size (Spec.DiskBytes), its image kept in
	// DiskDir, by default STATEDIR/docker/daemon-NAME/disks (a StateDir
	// or a DiskDir is then required). CheckDisks tells whether this host
	// can.
	DiskBytes int64
	DiskDir   string

	// rq retries the removals of closed workspaces that failed (Removals).
	rq removals
}

var (
	_ backend.Warmer      = (*Backend)(nil)
	_ backend.Claimer     = (*Backend)(nil)
	_ backend.ImageReader = (*Backend)(nil)
	_ backend.Checker     = (*Backend)(nil)
	_ backend.Remover     = (*Backend)(nil)
	_ backend.Resumer     = (*Backend)(nil)
)

// Name returns "docker".
func (*Backend) Name() string { return "docker" }

// Open starts the session's container, named and labelled after it, its
// workspace filled with a copy of spec.Source when set.
func (d *Backend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	return d.start(ctx, spec, spec.Profile)
}

// Warm starts a container for a pool: named after a pool ID, labelled as
// the daemon's, and handed to a session as it is. The session's ID and
// variables reach its commands through the tool layer.
func (d *Backend) Warm(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	prof := spec.Profile
	prof.Session = "warm-" + strings.ToLower(rand.Text()[:16])
	spec.Source = ""
	return d.start(ctx, spec, prof)
}

// start starts a container for spec under prof. While it starts, the
// engine is pinged (watchEngine): an engine that does not answer — gone,
// or frozen for frozenAfter — fails it with an error wrapping
// backend.ErrUnreachable, as does any failure while the engine does not
// answer a ping. What a failed start or a Close could not remove is
// retried in the background (Removals).
func (d *Backend) start(ctx context.Context, spec backend.Spec, prof policy.Profile) (*backend.Instance, error) {
	wctx, stop := watchEngine(ctx, d.Client)
	defer stop()
	c, err := d.startContainer(wctx, spec, prof)
	if err != nil {
		if cause := context.Cause(wctx); ctx.Err() == nil && errors.Is(cause, backend.ErrUnreachable) {
			return nil, fmt.Errorf("docker backend: %w", cause)
		}
		if ctx.Err() == nil {
			if cerr := d.Check(ctx); cerr != nil {
				return nil, fmt.Errorf("docker backend: %w (the start failed: %v)", cerr, err)
			}
		}
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	return d.instance(c, &recorder{dir: d.daemonDir(spec.Labels[backend.LabelDaemon]), c: c, label: prof.Session}), nil
}

// instance is the Instance of c. Its Close removes c, and what the engine
// refuses of that is retried in the background (Removals); with a
// StateDir, its session's record is kept by r (Publish), its Close removes
// that too, and Leave leaves c running.
func (d *Backend) instance(c *Container, r *recorder) *backend.Instance {
	closeOrQueue := func(ctx context.Context) error {
		if err := c.Close(ctx); err != nil {
			d.queue().add(c.Name(), c.removeCtx, err)
		}
		return nil
	}
	inst := &backend.Instance{
		FS: c.Agent(), Bash: c.Bash(), Root: policy.WorkspaceDir, ID: c.Name(), Close: closeOrQueue,
		Done: c.Agent().Done(), Err: c.Agent().Err, Accept: c.Accept, Listen: c.Listen,
		Dial: c.agent.Dial, Export: c.Export, Import: c.Import, Pause: d.pause(c, r),
	}
	if r.dir != "" {
		inst.Publish, inst.Leave, inst.StateDir = r.publish, c.leave, r.stateDir
		inst.Close = func(ctx context.Context) error { return errors.Join(closeOrQueue(ctx), r.drop()) }
	}
	return inst
}

func (d *Backend) startContainer(ctx context.Context, spec backend.Spec, prof policy.Profile) (*Container, error) {
	ref, err := engine.Resolve(ctx, d.Client, prof.Image)
	if err != nil {
		return nil, err
	}
	prof.Image = ref
	s := Spec{Profile: prof, Labels: spec.Labels, Agent: d.Agent, WorkspaceDir: spec.Source, MaxWorkspaceBytes: d.MaxWorkspaceBytes, HandoffDir: d.HandoffDir}
	if d.DiskBytes > 0 {
		s.DiskBytes, s.DiskDir = d.DiskBytes, d.diskDir(spec.Labels[backend.LabelDaemon])
		if s.DiskDir == "" {
			return nil, errors.New("a session's disk (DiskBytes) needs a StateDir or a DiskDir")
		}
	}
	return start(ctx, d.Client, s, d.queue())
}

// CheckDisks reports whether daemon's sessions can have disks of their
// own (DiskBytes) on this host, as the package's CheckDisks does, in their
// directory.
func (d *Backend) CheckDisks(ctx context.Context, daemon string) error {
	dir := d.diskDir(daemon)
	if dir == "" {
		return errors.New("a session's disk needs a StateDir or a DiskDir")
	}
	return CheckDisks(ctx, d.Client, dir)
}

// diskDir is where daemon's sessions' disks are kept, or "" without a
// DiskDir or a StateDir.
func (d *Backend) diskDir(daemon string) string {
	if d.DiskDir != "" {
		return d.DiskDir
	}
	if dir := d.daemonDir(daemon); dir != "" {
		return filepath.Join(dir, "disks")
	}
	return ""
}

// DefaultHandoffDir is where a daemon keeps its containers' handoff
// directories (Backend.HandoffDir) for the engine cli talks to: "" when the
// engine is not reached through a Unix socket of this host, and so may not
// share its filesystem. A daemon that runs as root uses
// /run/sandboxd/handoff; any other, $XDG_RUNTIME_DIR/sandboxd-handoff, or
// a directory of its uid in the temporary directory. A directory that is
// not the daemon's own and closed to others is refused when a container
// starts.
func DefaultHandoffDir(cli Engine) string {
	if !strings.HasPrefix(cli.DaemonHost(), "unix://") {
		return ""
	}
	switch {
	case os.Geteuid() == 0:
		return "/run/sandboxd/handoff"
	case os.Getenv("XDG_RUNTIME_DIR") != "":
		return filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "sandboxd-handoff")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("sandboxd-handoff-%d", os.Geteuid()))
}

// Reap removes the containers and volumes carrying labels whose owner has
// ended ([backend.Owner.Gone]), and those an earlier version made without an
// owner: what dead runs of the daemon left, and the sessions' disks
// (DiskBytes) whose volume is gone. What a run that may live holds
// is left alone, and so are the sessions the daemon recorded (StateDir),
// for Resume.
func (d *Backend) Reap(ctx context.Context, labels map[string]string) (int, error) {
	recorded := d.recordedLabels(labels[backend.LabelDaemon])
	n, err := Reap(ctx, d.Client, labels, func(l map[string]string) bool {
		return !recorded[l[policy.LabelSession]] && ownerGone(l)
	})
	// The disks whose volume is gone, which no Reap of volumes finds.
	return n, errors.Join(err, sweepDisks(ctx, d.Client, d.diskDir(labels[backend.LabelDaemon])))
}

// ownerGone reports whether the owner labels name has ended, or none is named.
func ownerGone(labels map[string]string) bool {
	o, ok := backend.OwnerOf(labels)
	return !ok || o.Gone()
}

// markerPrefix starts the name of a daemon's marker container (Claim).
const markerPrefix = "sandboxd-daemon-"

// Claim makes this run the only live one of its daemon (spec.Labels'
// [backend.LabelDaemon]) on the engine: it creates a container named after
// the daemon, from spec.Profile.Image and never started, that carries
// spec.Labels and so its owner. The engine refuses a second container of a
// name, so of two runs only one holds the marker. A marker whose owner has
// ended ([backend.Owner.Gone]) is removed, by its ID, and taken. While its
// owner may live, Claim fails with [backend.ErrDaemonRunning] naming it.
// release removes the marker.
func (d *Backend) Claim(ctx context.Context, spec backend.Spec) (release func(context.Context) error, err error) {
	daemon := spec.Labels[backend.LabelDaemon]
	name := markerPrefix + strings.Trim(markerUnsafe.ReplaceAllString(daemon, "-"), "-.")
	for range 3 {
		created, err := d.Client.ContainerCreate(ctx, client.ContainerCreateOptions{
			Name: name,
			Config: &container.Config{
				Image: spec.Profile.Image, Entrypoint: []string{"/.sandboxd-never-started"}, Cmd: []string{},
				NetworkDisabled: true, Labels: spec.Labels,
			},
			HostConfig: &container.HostConfig{NetworkMode: "none"},
		})
		if err == nil {
			stop := d.heartbeat(daemon)
			return func(ctx context.Context) error {
				stop()
				_, err := d.Client.ContainerRemove(context.WithoutCancel(ctx), created.ID, client.ContainerRemoveOptions{Force: true})
				if err != nil && !cerrdefs.IsNotFound(err) {
					return fmt.Errorf("docker backend: removing the daemon's marker %s: %w", name, err)
				}
				return nil
			}, nil
		}
		if !cerrdefs.IsConflict(err) {
			return nil, fmt.Errorf("docker backend: creating the daemon's marker %s from image %s: %w", name, spec.Profile.Image, err)
		}
		held, err := d.Client.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
		if cerrdefs.IsNotFound(err) {
			continue // its holder just removed it
		}
		if err != nil {
			return nil, fmt.Errorf("docker backend: the daemon's marker %s: %w", name, err)
		}
		var labels map[string]string
		if held.Container.Config != nil {
			labels = held.Container.Config.Labels
		}
		owner, ok := backend.OwnerOf(labels)
		if ok && owner.Gone() {
			// By ID: a run that took the name meanwhile keeps it.
			_, err := d.Client.ContainerRemove(ctx, held.Container.ID, client.ContainerRemoveOptions{Force: true})
			if err != nil && !cerrdefs.IsNotFound(err) {
				return nil, fmt.Errorf("docker backend: removing the marker %s of an ended run: %w", name, err)
			}
			continue
		}
		who, fix := "a run that names no owner", ""
		if ok {
			who = owner.String()
		}
		if !ok || owner.Host != backend.Self().Host {
			// Only its own host can tell whether that process lives.
			fix = fmt.Sprintf("; once that daemon is gone for sure, remove its marker with 'docker rm %s'", name)
		}
		return nil, fmt.Errorf("%w: daemon %q runs on this engine (%s, since %s; its marker is the container %s): "+
			"stop it, or give this daemon another name (\"daemon\" in the configuration)%s",
			backend.ErrDaemonRunning, daemon, who, held.Container.Created, name, fix)
	}
	return nil, fmt.Errorf("docker backend: the daemon's marker %s changed hands while it was claimed; try again", name)
}

var markerUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)
