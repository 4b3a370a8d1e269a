package docker

import (
	"archive/tar"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// Spec describes one session container.
type Spec struct {
	// Profile is the container's isolation, from policy.Policy.Apply or
	// policy.DefaultProfile; its Image must exist on the engine (see
	// engine.Ensure).
	Profile policy.Profile
	// Env is added to the container's environment, which every command
	// inherits.
	Env map[string]string
	// Labels are added to the labels of the container and its workspace
	// volume, beside those of the profile.
	Labels map[string]string
	// WorkspaceDir, when set, is a host directory whose contents become the
	// initial workspace (regular files, directories and links; other kinds
	// are skipped). Everything is owned by the profile's user.
	WorkspaceDir string
	// Workspace, when set, is a tar stream of the initial workspace, names
	// relative to the workspace root. Owners are set to the profile's user;
	// entries other than files, directories and links are dropped.
	Workspace io.Reader
	// MaxWorkspaceBytes caps the bytes of files the initial copy writes.
	// The sparse files of WorkspaceDir are written with their holes kept and
	// count by their data; a Workspace stream's files count at their full
	// size. Start fails, naming the cap, when the copy would pass it. Zero
	// is DefaultMaxWorkspaceBytes.
	MaxWorkspaceBytes int64
	// Agent is the path of the sandboxd-agent binary; "" finds it with
	// FindAgent.
	Agent string
	// Stderr receives the agent's log (its standard error); nil discards it.
	Stderr io.Writer
	// AgentOptions configure the agent client.
	AgentOptions []agent.ClientOption
	// HandoffDir, when set, is a directory of the daemon's host, kept to
	// itself (Start makes it with mode 0700), in which Start makes one
	// directory for the container, bind-mounted read-only at
	// /.sandboxd-handoff: Container.Accept has the agent hand the
	// container's egress connections to the daemon over a Unix socket
	// there, so their bytes bypass the attach stream. It works when the
	// daemon and the engine share a filesystem; where the engine has no
	// such path Start leaves the mount out, and where the agent cannot
	// reach the socket Accept carries connections on the stream.
	HandoffDir string
	// DiskBytes, when above zero, gives the workspace a file system of its
	// own of that size (see LabelDisk): a write past it fails with ENOSPC
	// inside the session, and the host's disk gives it no more. Its image
	// is kept in DiskDir (required with it); the daemon must run as root
	// beside the engine (CheckDisks). Zero leaves the workspace on the
	// engine's disk, unbounded.
	DiskBytes int64
	DiskDir   string
}

// DefaultMaxWorkspaceBytes is the default of Spec.MaxWorkspaceBytes.
const DefaultMaxWorkspaceBytes = 1 << 30

// Container is a running session container and the agent client talking to
// its PID 1. Close removes it.
type Container struct {
	id, name, volume string
	// disk is the image of the workspace's own file system, or ""
	// (Spec.DiskBytes).
	disk  string
	cli   Engine
	agent *agent.Client
	conn  io.Closer
	bash  *Bash
	// stderr and agentOpts are Spec.Stderr and Spec.AgentOptions, for
	// every connection to the agent.
	stderr    io.Writer
	agentOpts []agent.ClientOption
	// uid is the session uid the container runs as, taken from
	// Profile.SessionUIDs, or 0; released once the container is removed.
	uid     int
	release sync.Once
	// owner is the uid and gid the workspace's files belong to; maxBytes
	// caps what an Import writes (Spec.MaxWorkspaceBytes).
	owner    [2]int
	maxBytes int64
	// q retries removals that fail (the Backend's); nil without one.
	q *removals
	// freezing serialises Export's freezes of the container.
	freezing sync.Mutex

	handoffDir  string // the host's side of /.sandboxd-handoff, or ""
	hmu         sync.Mutex
	handoffAddr string                 // what Accept listens on, from its first call
	handoff     *agent.HandoffListener // nil: connections are carried on the stream
	handoffErr  error                  // why there is no handoff
}

// ID is the container's ID.
func (c *Container) ID() string { return c.id }

// Name is the container's name.
func (c *Container) Name() string { return c.name }

// Agent is the client of the agent in the container: a workspace.FileSystem
// with its extensions, and a workspace.Bash.
func (c *Container) Agent() *agent.Client { return c.agent }

// Bash is the container's workspace.Bash.
func (c *Container) Bash() *Bash { return c.bash }

// mountAgent is where the agent volume is mounted, read-only.
const mountAgent = "/.sandboxd-agent"

// Home is a session's HOME, whatever the image says (unless Spec.Env sets
// one): a writable directory of its own on the workspace volume, under
// sandboxd's bookkeeping, so what programs keep there — Go's module and
// build caches, pip's, npm's, a git configuration — is never delivered,
// diffed or shown to git, and lives on disk, not in the memory a tmpfs
// would take. (The root filesystem is read-only, and HOME=/workspace, as
// the dev image had it, put those caches among the agent's work.)
const Home = policy.WorkspaceDir + "/" + workspace.BookkeepingDir + "/home"

// Start creates a container for spec, hardened as spec.Profile says, with
// the agent volume mounted read-only at /.sandboxd-agent and a fresh
// workspace volume at /workspace. It copies the initial workspace in while
// the container is created but not started (no code runs in it yet, so the
// copy cannot be raced), attaches to PID 1's standard streams, starts it and
// completes the agent's handshake. On failure nothing is left behind.
func Start(ctx context.Context, cli Engine, spec Spec) (*Container, error) {
	return start(ctx, cli, spec, nil)
}

// start is Start; with q, what a failure leaves that cannot be removed
// at once is retried there (cleanup).
func start(ctx context.Context, cli Engine, spec Spec, q *removals) (*Container, error) {
	prof := spec.Profile
	if err := prof.Validate(); err != nil {
		return nil, err
	}
	if spec.WorkspaceDir != "" && spec.Workspace != nil {
		return nil, errors.New("dockerexec: set WorkspaceDir or Workspace, not both")
	}
	c := &Container{cli: cli, name: containerName(prof.Session), q: q}
	if prof.SessionUIDs.Count > 0 && !prof.IsRoot() {
		var err error
		if c.uid, err = prof.SessionUIDs.Take(); err != nil {
			return nil, err
		}
		prof.User = fmt.Sprintf("%d:%d", c.uid, c.uid)
	}
	uid, gid := ids(prof.User)
	c.owner, c.maxBytes = [2]int{uid, gid}, cmp.Or(spec.MaxWorkspaceBytes, DefaultMaxWorkspaceBytes)
	agentPath := spec.Agent
	if agentPath == "" {
		var err error
		if agentPath, err = FindAgent(); err != nil {
			c.cleanup(ctx)
			return nil, err
		}
	}
	agentVol, err := agentVolume(ctx, cli, agentPath, prof.Image)
	if err != nil {
		c.cleanup(ctx)
		return nil, err
	}

	labels := prof.Labels()
	maps.Copy(labels, spec.Labels)
	c.volume = c.name + "-workspace"
	var driverOpts map[string]string
	if spec.DiskBytes > 0 {
		if spec.DiskDir == "" {
			c.cleanup(ctx)
			return nil, errors.New("dockerexec: Spec.DiskBytes needs a Spec.DiskDir")
		}
		var err error
		if c.disk, err = makeDisk(ctx, spec.DiskDir, c.volume, spec.DiskBytes, uid, gid); err != nil {
			c.cleanup(ctx)
			return nil, err
		}
		defer markMaking(c.disk, false)
		labels[LabelDisk] = c.disk
		driverOpts = diskOpts(c.disk)
	}
	if _, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: c.volume, Driver: "local", DriverOpts: driverOpts, Labels: labels}); err != nil {
		// The engine may have made it before the failure reached us.
		c.cleanup(ctx)
		return nil, fmt.Errorf("dockerexec: create workspace volume: %w", err)
	}
	// An image of sandboxd's own hands its /workspace, owned by the session's
	// user, to the empty volume. Any other image gets a volume whose root is
	// given to the user first, and mounted without copying the image's.
	// (A session uid of its own is never the image's, so this is the usual
	// case; the loader runs while the container is made.)
	owned := workspaceOwned(ctx, cli, prof.Image, uid, gid)
	chowned := make(chan error, 1)
	if owned || c.disk != "" {
		// A disk's root was made the user's by mkfs.
		chowned <- nil
	} else {
		go func() { chowned <- chownVolume(ctx, cli, q, prof.Image, c.volume, uid, gid, labels) }()
	}
	cfg, hc, err := containerConfig(prof, spec.Env, labels, agentVol, c.volume, driverOpts, !owned)
	if err != nil {
		<-chowned
		c.cleanup(ctx)
		return nil, err
	}
	m, hostDir, handoff, err := handoffMount(spec.HandoffDir)
	if err != nil {
		<-chowned
		c.cleanup(ctx)
		return nil, err
	}
	if handoff {
		c.handoffDir = hostDir
		hc.Mounts = append(hc.Mounts, m)
	}
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: c.name, Config: cfg, HostConfig: hc})
	if handoff && handoffSourceMissing(err) {
		// The engine's host has no such directory: connections will be
		// carried on the stream.
		removeHandoffDir(c.handoffDir)
		c.handoffDir, c.handoffErr = "", fmt.Errorf("the engine does not see the handoff directory %s: %w", hostDir, err)
		hc.Mounts = hc.Mounts[:len(hc.Mounts)-1]
		created, err = cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: c.name, Config: cfg, HostConfig: hc})
	}
	c.id = created.ID
	if cerr := <-chowned; err == nil && cerr != nil {
		err = cerr
	} else if err != nil {
		err = fmt.Errorf("dockerexec: create container: %w", err)
	}
	if err != nil {
		c.cleanup(ctx)
		return nil, err
	}
	if err := c.start(ctx, spec, uid, gid); err != nil {
		c.cleanup(ctx)
		return nil, err
	}
	return c, nil
}

func (c *Container) start(ctx context.Context, spec Spec, uid, gid int) error {
	var src io.Reader
	var sparse []string
	switch {
	case spec.WorkspaceDir != "":
		src = tarDir(spec.WorkspaceDir, &sparse)
	case spec.Workspace != nil:
		src = spec.Workspace
	}
	budget := &copyBudget{limit: cmp.Or(spec.MaxWorkspaceBytes, DefaultMaxWorkspaceBytes)}
	if src != nil {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(ownTar(pw, src, uid, gid, budget)) }()
		_, err := c.cli.CopyToContainer(ctx, c.id, client.CopyToContainerOptions{DestinationPath: policy.WorkspaceDir, Content: pr})
		pr.CloseWithError(err)
		if err != nil {
			return fmt.Errorf("dockerexec: copy the workspace in: %w", err)
		}
	}

	c.stderr, c.agentOpts = spec.Stderr, spec.AgentOptions
	if err := c.connect(ctx, func() error {
		_, err := c.cli.ContainerStart(ctx, c.id, client.ContainerStartOptions{})
		return err
	}); err != nil {
		return err
	}
	ag := c.agent
	// Sparse files, which the archive API would write in full, are written
	// by the agent with their holes, before anyone else can run a command.
	for _, name := range sparse {
		if err := c.writeSparse(ctx, spec.WorkspaceDir, name, budget); err != nil {
			ag.Close()
			return err
		}
	}
	return nil
}

// connect attaches to PID 1's standard streams and makes the agent's
// client over them. With start, it starts the container once attached
// (a fresh container: the agent's first client); without, the stream is
// one an earlier client used (agent.WithResync).
func (c *Container) connect(ctx context.Context, start func() error) error {
	att, err := c.cli.ContainerAttach(ctx, c.id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return fmt.Errorf("dockerexec: attach: %w", err)
	}
	if start != nil {
		if err := start(); err != nil {
			att.Close()
			return fmt.Errorf("dockerexec: start: %w", err)
		}
	}
	logTail := agent.NewLogTail(1024)
	stderr := io.MultiWriter(logTail, cmp.Or[io.Writer](c.stderr, io.Discard))
	stream := &attachStream{demux: demux{r: att.Reader, stderr: stderr}, conn: att.Conn}
	opts := []agent.ClientOption{agent.WithEndExplained(c.endState), agent.WithHangup(c.kill), agent.WithStall(c.stalled)}
	if start == nil {
		opts = append(opts, agent.WithResync())
	}
	ag, err := agent.NewClient(stream, append(opts, c.agentOpts...)...)
	if err != nil {
		att.Close()
		return fmt.Errorf("dockerexec: agent in %s: %w%s%s", c.name, err, c.state(context.WithoutCancel(ctx)), logTail)
	}
	c.conn, c.agent, c.bash = att.Conn, ag, &Bash{c: c}
	return nil
}

// Reconnect drops the container's stream to its agent as the daemon's
// death would — no goodbye; what was in flight is cut — and attaches
// again: the agent ends what the former connection left (its calls fail;
// background commands run on) and serves the new one. Calls must not run
// meanwhile; Agent and Bash are new values afterwards.
func (c *Container) Reconnect(ctx context.Context) error {
	c.conn.Close()
	c.agent.Close()
	return c.connect(ctx, nil)
}

// kill ends a container whose agent stopped answering (a command froze
// it, say): the agent can no longer enforce a command's timeout, so the
// host does, by killing the whole container. It returns words for the
// error every call of the session gives from then on.
func (c *Container) kill() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.cli.ContainerKill(ctx, c.id, client.ContainerKillOptions{Signal: "KILL"}); err != nil && !cerrdefs.IsNotFound(err) {
		return "killing the container failed: " + err.Error()
	}
	return "the container was killed"
}

// endState is how the container ended, for the errors of an agent stream
// that broke: the engine may take a moment to see the exit (seconds, on a
// loaded host), so while the container still looks alive it waits for the
// engine's word that it stopped, up to endStateWait; a container that runs
// on (a stream broken by garbage, not by an exit) is then said to run.
func (c *Container) endState() string {
	if st := c.state(context.Background()); st != "" {
		return st
	}
	ctx, cancel := context.WithTimeout(context.Background(), endStateWait)
	defer cancel()
	wait := c.cli.ContainerWait(ctx, c.id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-wait.Result:
	case <-wait.Error:
	}
	return c.state(context.Background())
}

// endStateWait bounds endState's wait for the engine to see an exit.
const endStateWait = 5 * time.Second

// state describes how the container stands, for error messages: "" when
// it runs, else its status, exit code, OOM kill and the engine's error.
func (c *Container) state(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.cli.ContainerInspect(ctx, c.id, client.ContainerInspectOptions{})
	if err != nil || res.Container.State == nil {
		return ""
	}
	s := res.Container.State
	if s.Running && !s.Paused {
		return ""
	}
	msg := fmt.Sprintf(" (container %s, exit code %d", s.Status, s.ExitCode)
	if s.OOMKilled {
		msg += ", killed for lack of memory"
	}
	if s.Error != "" {
		msg += ": " + s.Error
	}
	return msg + ")"
}

// Close ends the session: it closes the agent's stream and removes the
// container and its workspace volume. It is safe to call more than once.
func (c *Container) Close(ctx context.Context) error {
	if c.agent != nil {
		c.agent.Close()
	}
	return c.removeCtx(ctx)
}

func (c *Container) remove() { c.removeCtx(context.Background()) }

// cleanup removes what a failed Start made. Without a queue it is remove.
// With one, a removal that fails is retried there; and when ctx ended
// because the engine does not answer (watchEngine), the removal goes to
// the queue at once rather than wait out its bound here.
func (c *Container) cleanup(ctx context.Context) {
	if c.q == nil {
		c.remove()
		return
	}
	if errors.Is(context.Cause(ctx), backend.ErrUnreachable) {
		c.q.add(c.name, c.removeCtx, nil)
		return
	}
	if err := c.removeCtx(context.Background()); err != nil {
		c.q.add(c.name, c.removeCtx, err)
	}
}

func (c *Container) removeCtx(ctx context.Context) error {
	// Removal must finish even when the caller's context ends (an HTTP or
	// MCP request that closed, a shutdown deadline): a container removed
	// without its volume would leak the volume. Keep the caller's values,
	// not its cancellation, and bound the removal on its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if c.conn != nil {
		c.conn.Close()
	}
	var errs []error
	if c.id != "" {
		_, err := c.cli.ContainerRemove(ctx, c.id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("dockerexec: remove container %s: %w", c.name, err))
		}
	}
	if c.volume != "" {
		if err := removeVolume(ctx, c.cli, c.volume); err != nil {
			errs = append(errs, err)
		} else if c.disk != "" {
			// Only once the volume is gone: the engine unmounted it.
			if err := removeDisk(ctx, c.disk); err != nil {
				errs = append(errs, err)
			}
		}
	}
	c.hmu.Lock()
	if c.handoff != nil {
		c.handoff.Close()
	}
	c.hmu.Unlock()
	if err := removeHandoffDir(c.handoffDir); err != nil {
		errs = append(errs, fmt.Errorf("dockerexec: remove the handoff directory: %w", err))
	}
	if len(errs) == 0 && c.uid != 0 {
		// No process runs as the uid any more: another container may.
		c.release.Do(func() { policy.ReleaseUID(c.uid) })
	}
	return errors.Join(errs...)
}

// removeVolume removes a session's workspace volume and, first, every
// container that still mounts it. The volume is the session's alone, so
// such a container is one of its own whose ID never reached us: the
// session's container or a loader whose create was cut short by a
// cancelled context after the engine had made it (the engine answers
// "volume is in use" for as long as it exists).
func removeVolume(ctx context.Context, cli Engine, name string) error {
	_, err := cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	list, lerr := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("volume", name)})
	if lerr != nil || len(list.Items) == 0 {
		return fmt.Errorf("dockerexec: remove volume %s: %w", name, err)
	}
	for _, ct := range list.Items {
		if _, err := cli.ContainerRemove(ctx, ct.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("dockerexec: remove container %s, which mounts the volume %s: %w", ct.ID, name, err)
		}
	}
	if _, err := cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("dockerexec: remove volume %s: %w", name, err)
	}
	return nil
}

// Reap removes every container, and then every volume, that carries all of
// labels and whose labels gone accepts (all of them when gone is nil) —
// those a crashed earlier run left behind, say — and reports how many
// containers it removed. What it leaves is never touched. Labels must not
// be empty.
func Reap(ctx context.Context, cli Engine, labels map[string]string, gone func(labels map[string]string) bool) (int, error) {
	if len(labels) == 0 {
		return 0, errors.New("dockerexec: Reap needs at least one label")
	}
	if gone == nil {
		gone = func(map[string]string) bool { return true }
	}
	f := make(client.Filters)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		f.Add("label", k+"="+labels[k])
	}
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("dockerexec: reap: %w", err)
	}
	var errs []error
	n := 0
	for _, ct := range list.Items {
		if !gone(ct.Labels) {
			continue
		}
		_, err := cli.ContainerRemove(ctx, ct.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		for _, m := range ct.Mounts {
			if m.Destination == mountHandoff {
				if err := removeHandoffDir(m.Source); err != nil {
					errs = append(errs, err)
				}
			}
		}
		n++
	}
	vols, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return n, errors.Join(append(errs, err)...)
	}
	for _, v := range vols.Items {
		if !gone(v.Labels) {
			continue
		}
		if _, err := cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		// The volume's own disk, if it names one of ours: the label and
		// the driver's device agree.
		if img := v.Labels[LabelDisk]; strings.HasSuffix(img, diskExt) && v.Options["device"] == devLink(img) {
			errs = append(errs, removeDisk(ctx, img))
		}
	}
	if errs = slices.DeleteFunc(errs, func(err error) bool { return err == nil }); len(errs) > 0 {
		return n, fmt.Errorf("dockerexec: reap: %w", errors.Join(errs...))
	}
	return n, nil
}

// containerConfig turns a profile into the engine's container configuration.
func containerConfig(p policy.Profile, env, labels map[string]string, agentVol, wsVol string, wsOpts map[string]string, noCopy bool) (*container.Config, *container.HostConfig, error) {
	secOpts := []string{}
	if p.NoNewPrivileges {
		secOpts = append(secOpts, "no-new-privileges:true")
	}
	sc := p.Seccomp
	if sc == nil {
		var err error
		if sc, err = policy.DefaultSeccomp(); err != nil {
			return nil, nil, err
		}
	}
	if sc != nil {
		js, err := json.Marshal(sc)
		if err != nil {
			return nil, nil, fmt.Errorf("dockerexec: seccomp profile: %w", err)
		}
		secOpts = append(secOpts, "seccomp="+string(js))
	}
	mounts := []mount.Mount{
		{Type: mount.TypeVolume, Source: agentVol, Target: mountAgent, ReadOnly: true, VolumeOptions: &mount.VolumeOptions{NoCopy: true}},
		// The labels matter only if the engine has to create the volume
		// here (it was removed since VolumeCreate, say at shutdown): then it
		// still carries them, so a label sweep finds it, and it is made on
		// the session's disk (wsOpts), or fails to mount, never unbounded.
		{Type: mount.TypeVolume, Source: wsVol, Target: policy.WorkspaceDir, VolumeOptions: &mount.VolumeOptions{NoCopy: noCopy, Labels: labels, DriverConfig: driverConfig(wsOpts)}},
	}
	for _, m := range p.HostMounts {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	var envList []string
	if _, ok := env["HOME"]; !ok {
		envList = append(envList, "HOME="+Home)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}
	pids := p.PidsLimit
	cfg := &container.Config{
		Image:           p.Image,
		User:            p.User,
		Hostname:        "sandbox",
		Env:             envList,
		Labels:          labels,
		Entrypoint:      []string{mountAgent + "/sandboxd-agent", "serve", "--root", policy.WorkspaceDir},
		Cmd:             []string{},
		WorkingDir:      policy.WorkspaceDir,
		AttachStdin:     true,
		AttachStdout:    true,
		AttachStderr:    true,
		OpenStdin:       true,
		NetworkDisabled: p.NetworkMode == policy.NetworkNone,
	}
	hc := &container.HostConfig{
		NetworkMode:    container.NetworkMode(p.NetworkMode),
		CapDrop:        p.CapDrop,
		CapAdd:         p.CapAdd,
		SecurityOpt:    secOpts,
		Privileged:     p.Privileged,
		ReadonlyRootfs: p.ReadonlyRootfs,
		Tmpfs:          map[string]string{"/tmp": "rw,exec,nosuid,nodev,mode=1777,size=" + strconv.FormatInt(p.TmpfsBytes, 10)},
		Mounts:         mounts,
		Runtime:        p.Runtime,
		IpcMode:        "private",
		LogConfig:      container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     p.MemoryBytes,
			MemorySwap: p.MemoryBytes, // no swap beyond the memory limit
			NanoCPUs:   p.NanoCPUs,
			PidsLimit:  &pids,
		},
	}
	if p.Runtime != "" && p.Runtime != policy.RuntimeRunc {
		// Under gVisor the pids cgroup counts the sandbox's host threads,
		// not the session's processes, which the sandbox's own kernel
		// keeps: a fork bomb would end the whole sandbox at the limit.
		// RLIMIT_NPROC, which gVisor enforces per user inside it, bounds
		// them instead. (Not under runc: there it counts the uid across
		// the host, and sessions may share one.)
		// The host's pids limit then bounds the sandbox's own threads and
		// processes (its kernel's, the gofer's, a stub or thread per
		// session thread): room for those, so that it never cuts the
		// sandbox short of RLIMIT_NPROC.
		hc.Resources.Ulimits = []*container.Ulimit{{Name: "nproc", Soft: pids, Hard: pids}}
		hostPids := 8*pids + 256
		hc.Resources.PidsLimit = &hostPids
	}
	return cfg, hc, nil
}

var nameUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

func containerName(session string) string {
	var b [4]byte
	rand.Read(b[:])
	s := strings.Trim(nameUnsafe.ReplaceAllString(session, "-"), "-.")
	if len(s) > 40 {
		s = s[:40]
	}
	if s == "" {
		return "sandboxd-" + hex.EncodeToString(b[:])
	}
	return "sandboxd-" + s + "-" + hex.EncodeToString(b[:])
}

// ids parses "uid[:gid]"; a missing gid is the uid.
func ids(user string) (uid, gid int) {
	u, g, ok := strings.Cut(user, ":")
	uid, _ = strconv.Atoi(u)
	gid = uid
	if ok {
		gid, _ = strconv.Atoi(g)
	}
	return uid, gid
}

// ownTar copies the tar stream src (which may be nil) to w with every entry
// owned by uid:gid. Only directories,
// regular files and symbolic links are kept; names are cleaned, and those
// that would leave the root are dropped. It fails before the regular files'
// sizes pass what is left of budget.
func ownTar(w io.Writer, src io.Reader, uid, gid int, budget *copyBudget) error {
	tw := tar.NewWriter(w)
	if src != nil {
		tr := tar.NewReader(src)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("workspace tar: %w", err)
			}
			name, ok := cleanName(h.Name)
			if !ok {
				continue
			}
			switch h.Typeflag {
			case tar.TypeDir:
				name += "/"
			case tar.TypeReg:
				if err := budget.take(name, h.Size); err != nil {
					return err
				}
			case tar.TypeSymlink:
			default:
				continue
			}
			out := &tar.Header{Typeflag: h.Typeflag, Name: name, Linkname: h.Linkname, Size: h.Size,
				Mode: h.Mode & 0o777, Uid: uid, Gid: gid, ModTime: h.ModTime, Format: tar.FormatPAX}
			if err := tw.WriteHeader(out); err != nil {
				return err
			}
			if h.Typeflag == tar.TypeReg {
				if _, err := io.Copy(tw, tr); err != nil {
					return err
				}
			}
		}
	}
	return tw.Close()
}

// cleanName returns a tar entry's name cleaned and relative, or false for
// the root itself and names that leave it.
func cleanName(name string) (string, bool) {
	name = path.Clean(strings.TrimPrefix(name, "/"))
	return name, name != "." && name != ".." && !strings.HasPrefix(name, "../")
}

// Bash is the workspace.Bash of a session container: every command runs in
// the container through its agent, in its own process group, and at its
// timeout the agent kills the whole tree. A process that escapes its group
// (setsid) is still found: the agent is PID 1 and kills what it must by
// walking the container's process table.
type Bash struct {
	c *Container

	mu        sync.Mutex
	homeTried bool // the session's home was made, or cannot be
}

var _ workspace.Bash = (*Bash)(nil)

// Shell is the program the container's agent runs scripts with ("/bin/bash",
// or a sh where the image has no bash); see workspace.ShellBash.
func (b *Bash) Shell() string { return b.c.agent.Shell() }

// Run runs cmd in the container; see workspace.Bash. When the container is
// gone (killed for lack of memory, say), the error is workspace.ErrUnavailable
// and its message says how the container ended.
//
// The session's home (Home) is made before its first command: a
// workspace no command ran in has no .sandboxd, as on every backend. A
// home that cannot be made is not a failure of the command.
func (b *Bash) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	b.makeHome(ctx, cmd.Timeout)
	return b.c.agent.Run(ctx, cmd)
}

// makeHome makes the session's home before the first command, within the
// command's timeout; see Run.
func (b *Bash) makeHome(ctx context.Context, timeout time.Duration) {
	b.mu.Lock()
	if !b.homeTried {
		// Tried once: a workspace that refuses it (a read-only one, a
		// seccomp profile without mkdir) runs its commands all the same,
		// without a home, as the image would have them. The making is
		// bounded by the command's timeout, so an agent that does not
		// answer it is found out in the command's time, as it is by the
		// command itself, not in a file call's CallBound (10 minutes).
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			hctx, cancel = context.WithTimeout(ctx, timeout)
		}
		err := workspace.Bookkeeping(hctx, b.c.agent, strings.TrimPrefix(Home, policy.WorkspaceDir+"/"), 0o700)
		b.homeTried = err == nil || hctx.Err() == nil // out of time: tried again by the next command
		cancel()
	}
	b.mu.Unlock()
}

// The agent keeps background commands itself, in the container: they run
// on, their output in its ring, while no daemon is connected.
var _ workspace.BackgroundBash = (*Bash)(nil)

// StartBackground starts a background command in the container's agent
// (workspace.BackgroundBash).
func (b *Bash) StartBackground(ctx context.Context, req workspace.BackgroundRequest) (workspace.BackgroundStatus, error) {
	return b.c.agent.StartBackground(ctx, req)
}

// ReadBackground reads a background command of the agent.
func (b *Bash) ReadBackground(ctx context.Context, id string, wait time.Duration) (workspace.BackgroundRead, error) {
	return b.c.agent.ReadBackground(ctx, id, wait)
}

// KillBackground stops a background command of the agent, its whole tree.
func (b *Bash) KillBackground(ctx context.Context, id string) (workspace.BackgroundRead, error) {
	return b.c.agent.KillBackground(ctx, id)
}

// ListBackground lists the agent's background commands.
func (b *Bash) ListBackground(ctx context.Context) ([]workspace.BackgroundStatus, error) {
	return b.c.agent.ListBackground(ctx)
}

// ExecOnce runs argv in the running container id as one `docker exec` does —
// create an exec, attach to it, read its output to the end, ask for its exit
// code — and fails unless it exits 0. It is the floor a session's command is
// compared with; sessions never use it.
func ExecOnce(ctx context.Context, cli Engine, id string, argv ...string) error {
	ex, err := cli.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: argv, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return err
	}
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return err
	}
	io.Copy(io.Discard, att.Reader)
	att.Close()
	ins, err := cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
	if err == nil && ins.ExitCode != 0 {
		err = fmt.Errorf("exec %q: exit %d", argv, ins.ExitCode)
	}
	return err
}
