package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/images/engine"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/workspace"
)

// A backendEntry is a backend sandboxd offers, and all the commands know of
// it: serve, soak, mcp, tools and bench find a backend here, and every
// "backends are …" message, flag help and usage line is made from this
// list. Adding a backend is a package under backend/ and an entry here.
type backendEntry struct {
	name  string
	about string // what it is, in a flag's help
	// serve opens it for the daemon (serve, soak) from the configuration,
	// and returns it with the reference of the default image
	// (runner.DefaultImage where there are no images).
	serve func(ctx context.Context, sio stdio, cfg *serveConfig) (backend.Backend, string, error)
	// session opens it for the one session of mcp and tools (and so of
	// bench) over a directory; nil when they do not offer it.
	session func(ctx context.Context, sio stdio, f *sessionFlags) (*openedBackend, error)
	// container: commands run in a container, whose image --image names and
	// whose network egress bounds; the others use the host's network.
	container bool
	// inPlace: the session works on the directory itself, so there is
	// nothing to deliver; the others start from a copy.
	inPlace bool
	// configured: it needs a key of the daemon's configuration of its own
	// (kubernetes), so soak, which writes the configuration, cannot run it.
	configured bool
}

// backends are the backends sandboxd offers, in the order commands list
// them: from the development ones to the isolated.
var backends = []backendEntry{
	{
		name: "local", about: "host directories, worked on in place by mcp and tools; commands on this host, not isolated",
		inPlace: true,
		serve: func(_ context.Context, _ stdio, cfg *serveConfig) (backend.Backend, string, error) {
			dir := cfg.DataDir
			if dir == "" {
				state, err := cfg.stateDir()
				if err != nil {
					return nil, "", err
				}
				dir = filepath.Join(state, "sessions")
			}
			return &local.Backend{Dir: dir}, runner.DefaultImage, nil
		},
		// The workspace root is the directory's absolute path.
		session: func(_ context.Context, _ stdio, f *sessionFlags) (*openedBackend, error) {
			return &openedBackend{backend: local.Dir{Path: f.workspace}, release: func() {}}, nil
		},
	},
	{
		name: "memory", about: "in-memory copies; commands on this host, not isolated",
		serve: func(context.Context, stdio, *serveConfig) (backend.Backend, string, error) {
			return memory.Backend{}, runner.DefaultImage, nil
		},
		// An in-memory copy of the directory, rooted at /workspace; nothing
		// is written back. Commands run in a private host copy that a
		// memory.Mirror keeps in step (see memory.Backend).
		session: func(_ context.Context, _ stdio, f *sessionFlags) (*openedBackend, error) {
			return &openedBackend{backend: memory.Backend{}, source: f.workspace, release: func() {}}, nil
		},
	},
	{
		name: "docker", about: "copies in hardened containers",
		container: true,
		serve:     serveDocker,
		session:   openDocker,
	},
	{
		name: "kubernetes", about: kubernetesAbout,
		container: true, configured: true,
		serve: func(_ context.Context, _ stdio, cfg *serveConfig) (backend.Backend, string, error) {
			return kubernetesBackend(cfg)
		},
	},
}

// Which commands offer a backend.
func servable(b backendEntry) bool    { return b.serve != nil }
func sessionable(b backendEntry) bool { return b.session != nil }
func soakable(b backendEntry) bool    { return b.serve != nil && !b.configured }

// backendNamed returns the backend called name among those offered, or a
// usage error listing them.
func backendNamed(name string, offered func(backendEntry) bool) (backendEntry, error) {
	i := slices.IndexFunc(backends, func(b backendEntry) bool { return b.name == name && offered(b) })
	if i < 0 {
		return backendEntry{}, usagef("unknown backend %q (backends are %s)", name, strings.Join(backendNames(offered), ", "))
	}
	return backends[i], nil
}

// backendNames lists the names of the backends offered that pass every
// test of also, in the order of backends.
func backendNames(offered func(backendEntry) bool, also ...func(backendEntry) bool) []string {
	var names []string
	for _, b := range backends {
		if offered(b) && !slices.ContainsFunc(also, func(f func(backendEntry) bool) bool { return !f(b) }) {
			names = append(names, b.name)
		}
	}
	return names
}

// backendChoices is the backends offered, for a synopsis: "local|memory".
func backendChoices(offered func(backendEntry) bool) string {
	return strings.Join(backendNames(offered), "|")
}

// backendHelp is a --backend flag's help: the backends offered, each with
// what it is.
func backendHelp(what string, offered func(backendEntry) bool) string {
	var parts []string
	for _, b := range backends {
		if offered(b) {
			parts = append(parts, b.name+" ("+b.about+")")
		}
	}
	return what + ": " + strings.Join(parts, ", ")
}

// Tests of an entry, for backendNames.
func inContainer(b backendEntry) bool { return b.container }
func onHost(b backendEntry) bool      { return !b.container }
func copied(b backendEntry) bool      { return !b.inPlace }

// orList joins names as prose: "a", "a or b", "a, b or c"; andList with
// "and".
func orList(names []string) string  { return proseList(names, "or") }
func andList(names []string) string { return proseList(names, "and") }

func proseList(names []string, conj string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// openBackend makes the configured backend, docker unless another is named.
func openBackend(ctx context.Context, sio stdio, cfg *serveConfig) (backend.Backend, string, error) {
	b, err := backendNamed(cmp.Or(cfg.Backend, "docker"), servable)
	if err != nil {
		return nil, "", err
	}
	inst, ref, err := b.serve(ctx, sio, cfg)
	if errors.As(err, new(failedClosed)) {
		err = fmt.Errorf("%w. For development only, --backend %s serve without it: their commands run on this host as your user, without isolation",
			err, strings.Join(backendNames(servable, onHost), " or --backend "))
	}
	return inst, ref, err
}

// failedClosed is a backend's refusal to start without what isolates its
// sessions, rather than fall back to a backend without isolation;
// openBackend names those that need nothing.
type failedClosed struct{ error }

func (f failedClosed) Unwrap() error { return f.error }

// openedBackend is what a --backend gives a session: the runner backend, the
// policy that names its image, the directory copied into the workspace ("",
// when the backend works on it in place) and how to release what opening
// took (a Docker client).
type openedBackend struct {
	backend backend.Backend
	policy  policy.Policy
	source  string
	release func()
	// taken, when not nil, is called once the session to resume
	// (sessionFlags.resume) is the run's: until then a failure to take it
	// back leaves its workspace rather than removing it.
	taken func()
}

// serveDocker is the daemon's Docker backend: it makes sure the images the
// configuration names exist, failing at once naming `sandboxd image build`
// when one does not (or building it, with progress, under buildMissing).
// It fails closed (failedClosed) when the engine does not answer.
func serveDocker(ctx context.Context, sio stdio, cfg *serveConfig) (backend.Backend, string, error) {
	cli, err := dockerClient(ctx)
	if err != nil {
		return nil, "", failedClosed{fmt.Errorf("docker backend: the engine does not answer: %w\n"+
			"Start Docker, or point DOCKER_HOST at a running engine (sandboxd doctor checks the setup)", err)}
	}
	// Every image the configuration names is checked now, not at a
	// session's first use.
	image := cmp.Or(cfg.Policy.DefaultImage, cfg.Image, images.Default)
	b, ref, err := dockerBackend(ctx, sio, cli, image, cfg.BuildMissing)
	for _, p := range cfg.Pools {
		if err == nil && p.Image != "" {
			_, err = ensureImage(ctx, sio, cli, p.Image, cfg.BuildMissing)
		}
	}
	if err == nil {
		b.StateDir, err = cfg.stateDir()
	}
	if err == nil {
		err = workspaceDisk(ctx, b, cfg)
	}
	if err != nil {
		cli.Close()
		return nil, "", err
	}
	return b, ref, nil
}

// workspaceDisk gives b's sessions disks of their own when
// limits.workspaceDisk says loop, once it knows this host can make them: a
// bound asked for and not there stops the start, naming why.
func workspaceDisk(ctx context.Context, b *docker.Backend, cfg *serveConfig) error {
	if cfg.Limits.WorkspaceDisk == diskLoop { // parse refused any other value
		b.DiskBytes = cmp.Or(cfg.Limits.WorkspaceBytes, defaultWorkspaceBytes)
		if err := b.CheckDisks(ctx, cmp.Or(cfg.Daemon, defaultDaemon)); err != nil {
			return fmt.Errorf("docker backend: limits.workspaceDisk is loop, but a session's disk cannot be made here: %w", err)
		}
	}
	return nil
}

// The values of limits.workspaceDisk.
const (
	diskOff  = "off"
	diskLoop = "loop"
)

func dockerClient(ctx context.Context) (*client.Client, error) {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cli.Close()
		return nil, err
	}
	return cli, nil
}

// openDocker starts from a copy of the directory in a hardened session
// container, rooted at /workspace. --image is an image definition's name
// (the engine must have it, or --build-missing builds it, with progress on
// standard error) or any image reference; the default is the minimal image.
func openDocker(ctx context.Context, sio stdio, f *sessionFlags) (*openedBackend, error) {
	cli, err := dockerClient(ctx)
	if err != nil {
		// (The backends on the host are named here, not looked up: the
		// table of backends holds this function.)
		return nil, fmt.Errorf("docker backend: %w (run 'sandboxd doctor'; for development only, --backend memory or --backend local runs commands on this host as your user, without isolation)", err)
	}
	b, ref, err := dockerBackend(ctx, sio, cli, cmp.Or(f.image, images.Default), f.buildMissing)
	if err != nil {
		cli.Close()
		return nil, err
	}
	if n, err := reapDeadRuns(ctx, sio, cli); err != nil {
		fmt.Fprintf(sio.err, "sandboxd: removing what killed runs left: %v\n", err)
	} else if n > 0 {
		fmt.Fprintf(sio.err, "sandboxd: removed %d containers and volumes that killed runs on this host left\n", n)
	}
	b.StateDir = f.stateDir
	opened := &openedBackend{
		backend: b,
		policy:  policy.Policy{DefaultImage: ref},
		source:  f.workspace,
		release: func() { cli.Close() },
	}
	if f.resume != "" {
		g := &keepUntilTaken{Backend: b}
		opened.backend, opened.taken = g, func() { g.taken.Store(true) }
	}
	return opened, nil
}

// reapDeadRuns removes the containers and volumes that earlier
// command-line runs (sandboxd mcp, tools) on this host left, once their
// process has ended (backend.Owner.Gone). Each run has a daemon name of its
// own, so no run's start reaps another's; a run whose process may live is
// left alone. A container whose mcp run keeps the baseline of undelivered
// work (runKept) is left too: that run's next one delivers it. Any other
// holds the only copy of whatever its session did: its work is harvested
// first, as a patch of its whole tree (harvest), and a container whose
// work cannot be read is left, and said so.
func reapDeadRuns(ctx context.Context, sio stdio, cli client.APIClient) (int, error) {
	self := map[string]string{backend.LabelOwnerHost: backend.Self().Host}
	dead := func(labels map[string]string) bool {
		o, ok := backend.OwnerOf(labels)
		return ok && strings.HasPrefix(labels[backend.LabelDaemon], "cli-") && o.Gone()
	}
	f := make(client.Filters)
	f.Add("label", backend.LabelOwnerHost+"="+self[backend.LabelOwnerHost])
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return 0, err
	}
	keep := map[string]bool{} // by session
	for _, ct := range list.Items {
		session := ct.Labels[policy.LabelSession]
		if !dead(ct.Labels) || session == "" {
			continue
		}
		switch run := ct.Labels[labelMCPRun]; {
		case run == runDiscard:
			continue
		case runKept(run):
			keep[session] = true
			continue
		}
		rep, err := harvest(ctx, cli, ct.ID, session)
		if rep != nil && rep.PatchFile != "" {
			fmt.Fprintf(sio.err, "sandboxd: a killed run left the container of session %s; its work is kept:\n%s", session, rep)
		}
		if err != nil {
			fmt.Fprintf(sio.err, "sandboxd: the container of session %s, which a killed run left, is kept: its work could not be read (%v)\n", session, err)
			keep[session] = true
		}
	}
	return docker.Reap(ctx, cli, self, func(labels map[string]string) bool {
		return dead(labels) && !keep[labels[policy.LabelSession]]
	})
}

// dockerBackend is the Docker backend over cli, once what every session
// needs is there: the agent binary, and image (when not "") as ensureImage
// makes sure. It returns image's reference.
func dockerBackend(ctx context.Context, sio stdio, cli *client.Client, image string, build bool) (*docker.Backend, string, error) {
	agent, err := docker.FindAgent()
	if err != nil {
		return nil, "", fmt.Errorf("docker backend: %w", err)
	}
	var ref string
	if image != "" {
		if ref, err = ensureImage(ctx, sio, cli, image, build); err != nil {
			return nil, "", err
		}
	}
	return &docker.Backend{Client: cli, Agent: agent, HandoffDir: docker.DefaultHandoffDir(cli)}, ref, nil
}

// ensureImage returns the reference of image once the engine has it. An
// image the engine lacks is an error at once, naming what to run
// (engine.Resolve): nothing is built on a session's way in, where a client
// waits (an MCP initialize times out long before a build ends). With build,
// an image definition's name ("minimal", "dev") is built instead, reporting
// progress on standard error.
func ensureImage(ctx context.Context, sio stdio, cli engine.Client, image string, build bool) (string, error) {
	if d, derr := images.Lookup(image); derr != nil || !build {
		ref, err := engine.Resolve(ctx, cli, image)
		if err != nil && derr == nil && errors.Is(err, workspace.ErrUnavailable) {
			return "", fmt.Errorf("image %s (%s) is not built on this engine: run 'sandboxd image build %s' first (%s), or start with --build-missing to build it now: %w",
				d.Name, d.Ref(), d.Name, buildCost(d.Name), workspace.ErrUnavailable)
		}
		return ref, err
	}
	ref, err := engine.Ensure(ctx, cli, image, engine.WithProgress(progressPrinter(sio, "image "+image)))
	if err != nil {
		return "", fmt.Errorf("image %s: %w", image, err)
	}
	return ref, nil
}
