package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// sessionFlags are the flags that describe one session's workspace and tools,
// shared by "sandboxd mcp" and "sandboxd tools".
type sessionFlags struct {
	backend   string
	workspace string
	config    string
	grants    listFlag
	always    listFlag
	image     string
	egress    listFlag
	shell     shellFlags
	// uncapped: the session has no turns (MCP), so it has no call cap
	// unless the configuration file sets maxCallsPerRun.
	uncapped bool
}

func (f *sessionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.backend, "backend", "local", "where the workspace lives: "+strings.Join(backendNames(), ", "))
	fs.StringVar(&f.workspace, "workspace", ".", "the workspace `dir`ectory: worked on in place (local), or copied (memory, docker)")
	fs.StringVar(&f.config, "config", "", "a JSON configuration `file` of tool options (maxLines, bashTimeoutMs, …)")
	fs.Var(&f.grants, "grant", "a `permission` to give: fs.write (write, edit) or shell.exec (bash); repeatable")
	fs.Var(&f.always, "always", "`skills` active from the first step, comma separated: read, edit, shell (replaces the configuration's always)")
	fs.StringVar(&f.image, "image", "", "the container `image` of the docker backend")
	fs.Var(&f.egress, "egress", "what the docker backend's commands may reach through sandboxd's proxy: a `preset` ("+
		strings.Join(egress.PresetNames(), ", ")+") or HOST:PORT (*.domain:PORT for the names below it); repeatable (default: nothing)")
	f.shell.register(fs)
}

// listFlag is a flag that may be repeated and takes comma-separated values.
type listFlag struct {
	set    bool
	values []string
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(s string) error {
	l.set = true
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			l.values = append(l.values, v)
		}
	}
	return nil
}

// withSession declares the session flags on fs and returns a command that
// opens the session they describe, runs run with it, and closes it.
func withSession(fs *flag.FlagSet, run func(ctx context.Context, sio stdio, s *session) error) runFunc {
	var f sessionFlags
	f.register(fs)
	return func(ctx context.Context, sio stdio, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected arguments %q", args)
		}
		s, err := f.openSession(ctx, sio)
		if err != nil {
			return err
		}
		defer s.close()
		return run(ctx, sio, s)
	}
}

// toolsConfig is the tool configuration the flags give: the file's (or the
// defaults), with --grant added to its grants and --always replacing its
// always.
func (f *sessionFlags) toolsConfig() (tools.Config, error) {
	cfg := tools.DefaultConfig()
	var data []byte
	if f.config != "" {
		var err error
		if data, err = os.ReadFile(f.config); err != nil {
			return tools.Config{}, err
		}
		if cfg, err = parseToolsConfig(data, ""); err != nil {
			return tools.Config{}, fmt.Errorf("%s: %w", f.config, err)
		}
	}
	if f.uncapped && !jsonSets(data, "maxCallsPerRun") {
		cfg.MaxCallsPerRun = 0
	}
	for _, g := range f.grants.values {
		if !slices.Contains(cfg.Grants, g) {
			cfg.Grants = append(cfg.Grants, g)
		}
	}
	if f.always.set {
		cfg.Always = slices.Clone(f.always.values)
	}
	if err := f.shell.apply(&cfg); err != nil {
		return tools.Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		var oe *tools.OptionError
		if errors.As(err, &oe) && (oe.Option == "grants" && f.grants.set || oe.Option == "always" && f.always.set) {
			return tools.Config{}, usagef("--%s: %s", strings.TrimSuffix(oe.Option, "s"), oe.Reason)
		}
		return tools.Config{}, err
	}
	return cfg, nil
}

// jsonSets reports whether the JSON object data names option.
func jsonSets(data []byte, option string) bool {
	var keys map[string]json.RawMessage
	if json.Unmarshal(data, &keys) != nil {
		return false
	}
	_, ok := keys[option]
	return ok
}

// session is an open workspace and the tool set over it.
type session struct {
	id    string
	fs    workspace.FileSystem // the workspace's files, without the tools' rules
	set   *tools.Set
	close func() error
}

// openSession opens the workspace the flags name and builds its tool set,
// through the same runner backends and session code as "sandboxd serve":
// one runner.Manager holding one session. The caller must call close.
// Mistakes in the flags are usage errors; a configuration that cannot start
// (an always-on skill without its grant) fails naming what is missing.
func (f *sessionFlags) openSession(ctx context.Context, sio stdio) (*session, error) {
	open, ok := backends[f.backend]
	if !ok {
		return nil, usagef("unknown backend %q (backends are %s)", f.backend, strings.Join(backendNames(), ", "))
	}
	if f.image != "" && f.backend != "docker" {
		return nil, usagef("--image applies to --backend docker only")
	}
	out := egress.Policy{Allow: f.egress.values}
	if f.egress.set && f.backend != "docker" {
		return nil, usagef("--egress applies to --backend docker only: local and memory commands use the host's network")
	}
	if err := out.Validate(); err != nil {
		return nil, usagef("--egress: %v", err)
	}
	if info, err := os.Stat(f.workspace); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	} else if !info.IsDir() {
		return nil, fmt.Errorf("workspace %s is not a directory", f.workspace)
	}
	cfg, err := f.toolsConfig()
	if err != nil {
		return nil, err
	}
	b, err := open(ctx, sio, f)
	if err != nil {
		return nil, err
	}
	// A daemon name of its own: this process reaps nothing of another's
	// living run (see reapDeadRuns for those whose process is gone).
	m, err := runner.New(ctx, b.backend, runner.WithTools(cfg), runner.WithPolicy(b.policy), runner.WithEgress(out),
		runner.WithDaemonName("cli-"+strings.ToLower(rand.Text()[:12])))
	if err != nil {
		b.release()
		return nil, err
	}
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		defer b.release()
		return m.Shutdown(sctx)
	}
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "cli", Source: b.source})
	if err != nil {
		shutdown()
		var se *runner.SettingError
		if errors.As(err, &se) {
			// The message names the option, or the grant an always-on skill lacks.
			return nil, fmt.Errorf("cannot start the session: %s", se.Reason)
		}
		return nil, err
	}
	return &session{id: s.ID(), fs: s.FS(), set: s.Tools(), close: shutdown}, nil
}

// openedBackend is what a --backend gives a session: the runner backend, the
// policy that names its image, the directory copied into the workspace ("",
// when the backend works on it in place) and how to release what opening
// took (a Docker client).
type openedBackend struct {
	backend backend.Backend
	policy  policy.Policy
	source  string
	release func()
}

// backends are the values of --backend.
var backends = map[string]func(ctx context.Context, sio stdio, f *sessionFlags) (*openedBackend, error){
	// local works on the directory itself; the workspace root is its
	// absolute path.
	"local": func(_ context.Context, _ stdio, f *sessionFlags) (*openedBackend, error) {
		return &openedBackend{backend: local.Dir{Path: f.workspace}, release: func() {}}, nil
	},
	// memory starts from an in-memory copy of the directory, rooted at
	// /workspace; nothing is written back. Commands run in a private host
	// copy that memexec keeps in step (see memory.Backend).
	"memory": func(_ context.Context, _ stdio, f *sessionFlags) (*openedBackend, error) {
		return &openedBackend{backend: memory.Backend{}, source: f.workspace, release: func() {}}, nil
	},
	"docker": openDocker,
}

func backendNames() []string {
	names := slices.Collect(maps.Keys(backends))
	slices.Sort(names)
	return names
}

// openDocker starts from a copy of the directory in a hardened session
// container, rooted at /workspace. --image is an image definition's name
// (built when missing, with progress on standard error) or any image
// reference; the default is the minimal image.
func openDocker(ctx context.Context, sio stdio, f *sessionFlags) (*openedBackend, error) {
	cli, err := dockerClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("docker backend: %w (run 'sandboxd doctor')", err)
	}
	b, ref, err := dockerBackend(ctx, sio, cli, cmp.Or(f.image, images.Default))
	if err != nil {
		cli.Close()
		return nil, err
	}
	if n, err := reapDeadRuns(ctx, cli); err != nil {
		fmt.Fprintf(sio.err, "sandboxd: removing what killed runs left: %v\n", err)
	} else if n > 0 {
		fmt.Fprintf(sio.err, "sandboxd: removed %d containers and volumes that killed runs on this host left\n", n)
	}
	return &openedBackend{
		backend: b,
		policy:  policy.Policy{DefaultImage: ref},
		source:  f.workspace,
		release: func() { cli.Close() },
	}, nil
}

// reapDeadRuns removes the containers and volumes that earlier
// command-line runs (sandboxd mcp, tools) on this host left, once their
// process has ended (backend.Owner.Gone). Each run has a daemon name of its
// own, so no run's start reaps another's; a run whose process may live is
// left alone.
func reapDeadRuns(ctx context.Context, cli client.APIClient) (int, error) {
	return dockerexec.Reap(ctx, cli, map[string]string{backend.LabelOwnerHost: backend.Self().Host}, func(labels map[string]string) bool {
		o, ok := backend.OwnerOf(labels)
		return ok && strings.HasPrefix(labels[backend.LabelDaemon], "cli-") && o.Gone()
	})
}

// dockerBackend is the Docker backend over cli, once what every session
// needs is there: the agent binary, and image (when not "") as ensureImage
// makes sure. It returns image's reference.
func dockerBackend(ctx context.Context, sio stdio, cli *client.Client, image string) (*docker.Backend, string, error) {
	agent, err := dockerexec.FindAgent()
	if err != nil {
		return nil, "", fmt.Errorf("docker backend: %w", err)
	}
	var ref string
	if image != "" {
		if ref, err = ensureImage(ctx, sio, cli, image); err != nil {
			return nil, "", err
		}
	}
	return &docker.Backend{Client: cli, Agent: agent, HandoffDir: docker.DefaultHandoffDir(cli)}, ref, nil
}

// ensureImage returns the reference of image: an image definition's name
// ("minimal", "dev") is built when the engine lacks it, reporting progress
// on standard error; anything else is a reference the engine must have
// (images.Resolve names the fix when it has not).
func ensureImage(ctx context.Context, sio stdio, cli images.Client, image string) (string, error) {
	if _, err := images.Lookup(image); err != nil {
		return images.Resolve(ctx, cli, image)
	}
	ref, err := images.Ensure(ctx, cli, image, images.WithProgress(progressPrinter(sio, "image "+image)))
	if err != nil {
		return "", fmt.Errorf("image %s: %w", image, err)
	}
	return ref, nil
}
